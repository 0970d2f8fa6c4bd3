"""Cold start to the first token: `radixserve generate`, the pytest fixture, and where the time goes.

    python benchmarks/bench_startup.py --repeats 3

Each figure is a fresh interpreter (`sys.executable`), after the one-time
conversion of the embedded model (run once before: `radixserve generate hi`).
- cli: wall time from spawning `python -m radixserve generate "Hi" --max-tokens 1`
  to its first byte on stdout (the first token) and to its exit; the same with
  `--chat` (the prompt through the model's chat template);
- pytest: wall time of `pytest` running one test that asks the
  `radixserve_engine` fixture for one token (collection, plugins, load, token,
  exit), and from spawning it to that token (the test writes the time); the
  same with `PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p radixserve.testing`
  (only radixserve's plugin), and a trivial test without the fixture (what
  pytest and the installed plugins cost by themselves);
- phases: the same start in one process, timed step by step (import torch,
  import the engine, load the model (tokenizer and weights), start the worker,
  the first token), so the total can be split.
With `--baseline DIR` (e.g. a checkout of main) the same figures are taken for
that code too, interleaved with ours in one run: a before/after table.
Prints a table and writes JSON under benchmarks/results/. On a shared machine
the load average (recorded) inflates every figure alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PHASES = r"""
import json, sys, time
t0 = time.perf_counter()
marks = {}
def mark(name):
    marks[name] = round(time.perf_counter() - t0, 3)
import torch; mark("import torch")
from radixserve import AsyncEngine, EngineConfig, SamplingParams
import radixserve.engine; mark("import radixserve.engine")
# engine.start split by timing its steps in place (names both the old and the new code have).
import radixserve.model.loader as loader
spent = {"weights": 0.0, "tokenizer": 0.0, "KV pool": 0.0}
def timed(key, fn):
    def run(*a, **k):
        s = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[key] += time.perf_counter() - s
    return run
loader.load_checkpoint = timed("weights", loader.load_checkpoint)
loader.load_tokenizer = timed("tokenizer", loader.load_tokenizer)
radixserve.engine.KVPool = timed("KV pool", radixserve.engine.KVPool)
import asyncio
async def main():
    engine = AsyncEngine(EngineConfig(device="cpu"))
    await engine.start(); mark("engine.start")
    # Durations inside engine.start; the weights and the tokenizer may overlap (threads).
    for name, s in spent.items():
        marks["  in start: " + name] = round(s, 3)
    marks["heavy transformers modules imported"] = sorted(
        m for m in HEAVY if m in sys.modules
    )
    async for out in engine.generate("Hi", SamplingParams(max_tokens=1)):
        pass
    mark("first token")
    await engine.shutdown()
HEAVY = ("transformers", "torch.distributed.tensor", "transformers.modeling_utils",
         "transformers.configuration_utils", "transformers.models.auto.configuration_auto",
         "transformers.generation")
asyncio.run(main())
print(json.dumps(marks))
"""

TEST = """
import os, time

def test_one_token(radixserve_engine, radixserve_params):
    out = radixserve_engine.complete("Hi", radixserve_params.replace(max_tokens=1))
    assert out.finished
    with open(os.environ["RADIXSERVE_STARTUP_MARK"], "w") as f:  # when the test had its token
        f.write(repr(time.time()))
"""
TRIVIAL = """
def test_nothing():
    assert True
"""
# pytest settings: (the test, whether pytest autoloads the installed plugins).
PYTEST = {
    "pytest, one test on the radixserve_engine fixture": (TEST, True),
    "pytest without plugin autoload (-p radixserve.testing), the same test": (TEST, False),
    "pytest, one trivial test (pytest and its installed plugins alone)": (TRIVIAL, True),
}


def _env(root: Path = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli_once(root: Path = ROOT, chat: bool = False) -> dict[str, float]:
    cmd = [sys.executable, "-m", "radixserve", "generate", "Hi", "--max-tokens", "1", "--device", "cpu"]
    cmd += ["--chat"] if chat else []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(root), cwd=root)
    assert proc.stdout is not None
    proc.stdout.read(1)
    first = time.perf_counter() - t0
    proc.stdout.read()
    assert proc.wait() == 0
    return {"first_token_s": round(first, 3), "exit_s": round(time.perf_counter() - t0, 3)}


def pytest_once(root: Path = ROOT, test: str = TEST, autoload: bool = True) -> dict[str, float]:
    """One pytest process; without autoload only radixserve's plugin is loaded (`-p`)."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "test_startup_probe.py").write_text(test)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "radixserve_device=cpu"]
        env = _env(root)
        if not autoload:
            cmd += ["-p", "radixserve.testing"]
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        mark = Path(d, "first_token")
        env["RADIXSERVE_STARTUP_MARK"] = str(mark)
        t0, w0 = time.perf_counter(), time.time()
        subprocess.run([*cmd, "--rootdir", d, d], check=True, capture_output=True, env=env, cwd=d)
        out = {"total_s": round(time.perf_counter() - t0, 3)}
        if mark.exists():  # the fixture test: process start to its first token
            out["first_token_s"] = round(float(mark.read_text()) - w0, 3)
        return out


def phases_once(root: Path = ROOT) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PHASES], check=True, capture_output=True, text=True, env=_env(root), cwd=root
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(root: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    runs["cli"].append(cli_once(root))
    runs["cli --chat"].append(cli_once(root, chat=True))
    for name, (test, autoload) in PYTEST.items():
        runs[name].append(pytest_once(root, test, autoload))
    runs["phases"].append(phases_once(root))


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Best and median of each figure; the phases of the run with the fastest first token."""
    out: dict[str, Any] = {}
    for k in ("first_token_s", "exit_s"):
        vals = [r[k] for r in runs["cli"]]
        out[f"radixserve generate: {k}"] = (min(vals), statistics.median(vals))
    vals = [r["first_token_s"] for r in runs["cli --chat"]]
    out["radixserve generate --chat: first_token_s"] = (min(vals), statistics.median(vals))
    for name in PYTEST:
        vals = [r["total_s"] for r in runs[name]]
        out[name] = (min(vals), statistics.median(vals))
        firsts = [r["first_token_s"] for r in runs[name] if "first_token_s" in r]
        if firsts:  # process start to the test's first token (the rest is pytest's exit)
            out[f"{name}: first_token_s"] = (min(firsts), statistics.median(firsts))
    best = min(runs["phases"], key=lambda r: r["first token"])
    prev = 0.0
    for name, t in best.items():
        if not isinstance(t, float | int):
            continue
        if name.startswith("  in start"):
            out[f"phase: {name}"] = (t, "")
        else:
            out[f"phase: {name}"] = (round(t - prev, 3), t)
            prev = t
    return out


def main() -> int:
    sys.path.insert(0, str(HERE))
    from common import environment, print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--baseline",
        default=None,
        help="another checkout (e.g. of main) measured the same way, interleaved, as 'before'",
    )
    ap.add_argument("--out", default=str(HERE / "results" / "startup_cpu.json"))
    args = ap.parse_args()
    env = environment()
    roots = {"after": ROOT} if args.baseline is None else {"before": Path(args.baseline), "after": ROOT}
    for root in roots.values():
        cli_once(root)  # warm the page cache and the converted-model cache
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        k: {"cli": [], "cli --chat": [], **{name: [] for name in PYTEST}, "phases": []} for k in roots
    }
    for _ in range(args.repeats):  # interleaved, so load changes hit every setting alike
        for key, root in roots.items():
            measure(root, runs[key])
    sums = {k: summary(r) for k, r in runs.items()}
    heavy = {
        k: min(r["phases"], key=lambda p: p["first token"])["heavy transformers modules imported"]
        for k, r in runs.items()
    }
    headers = ["what"] + [f"{k}: {c}" for k in roots for c in ("best s", "median s")]
    rows: list[list[Any]] = []
    for name in sums["after"]:
        row: list[Any] = [name]
        for k in roots:
            a, b = sums[k].get(name, ("", ""))
            # A phase row shows its own duration and the time it ended at.
            row += [a, b if not name.startswith("phase") or b == "" else f"(at {b})"]
        rows.append(row)
    print_table(headers, rows)
    for k, mods in heavy.items():
        print(f"{k}: transformers modules imported by engine.start: {mods or 'none'}")
    write_results(
        args.out,
        [{"setting": k, "root": str(roots[k]), "runs": runs[k], "heavy_modules": heavy[k]} for k in roots],
        env,
        repeats=args.repeats,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
