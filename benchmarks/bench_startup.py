"""Cold start to the first token: `radixserve generate`, the pytest fixture, and where the time goes.

    python benchmarks/bench_startup.py --repeats 3

Each figure is a fresh interpreter (`sys.executable`), after the one-time
conversion of the embedded model (run once before: `radixserve generate hi`).
- cli: wall time from spawning `python -m radixserve generate "Hi" --max-tokens 1`
  to its first byte on stdout (the first token) and to its exit;
- pytest: wall time of `pytest` running one test that asks the
  `radixserve_engine` fixture for one token (collection, plugin, load, token);
- phases: the same start in one process, timed step by step (import torch,
  import the engine, load the model (tokenizer and weights), start the worker,
  the first token), so the total can be split.
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
import transformers, transformers.models.auto; mark("import transformers")
from radixserve import AsyncEngine, EngineConfig, SamplingParams
import radixserve.engine; mark("import radixserve.engine")
from radixserve.model.embedded import embedded_model_dir
from radixserve.model.tokenizer import load_tokenizer
load_tokenizer(embedded_model_dir()); mark("load the tokenizer (alone)")
import asyncio
async def main():
    engine = AsyncEngine(EngineConfig(device="cpu"))
    await engine.start(); mark("engine.start (model load, worker)")
    async for out in engine.generate("Hi", SamplingParams(max_tokens=1)):
        pass
    mark("first token")
    await engine.shutdown()
asyncio.run(main())
print(json.dumps(marks))
"""

TEST = """
def test_one_token(radixserve_engine, radixserve_params):
    out = radixserve_engine.complete("Hi", radixserve_params.replace(max_tokens=1))
    assert out.finished
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli_once() -> dict[str, float]:
    cmd = [sys.executable, "-m", "radixserve", "generate", "Hi", "--max-tokens", "1", "--device", "cpu"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT)
    assert proc.stdout is not None
    proc.stdout.read(1)
    first = time.perf_counter() - t0
    proc.stdout.read()
    assert proc.wait() == 0
    return {"first_token_s": round(first, 3), "exit_s": round(time.perf_counter() - t0, 3)}


def pytest_once() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "test_startup_probe.py").write_text(TEST)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "radixserve_device=cpu",
            "--rootdir",
            d,
            d,
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=_env(), cwd=d)
        return {"total_s": round(time.perf_counter() - t0, 3)}


def phases_once() -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PHASES], check=True, capture_output=True, text=True, env=_env(), cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    sys.path.insert(0, str(HERE))
    from common import environment, print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "startup_cpu.json"))
    args = ap.parse_args()
    env = environment()
    cli_once()  # warm the page cache and the converted-model cache
    runs: dict[str, list[dict[str, float]]] = {"cli": [], "pytest": [], "phases": []}
    for _ in range(args.repeats):  # interleaved, so load changes hit all three alike
        runs["cli"].append(cli_once())
        runs["pytest"].append(pytest_once())
        runs["phases"].append(phases_once())
    rows: list[list[Any]] = []
    for k in ("first_token_s", "exit_s"):
        vals = [r[k] for r in runs["cli"]]
        rows.append([f"radixserve generate: {k}", min(vals), statistics.median(vals)])
    vals = [r["total_s"] for r in runs["pytest"]]
    rows.append(["pytest, one test on the fixture", min(vals), statistics.median(vals)])
    best = min(runs["phases"], key=lambda r: r["first token"])
    prev = 0.0
    for name, t in best.items():
        rows.append([f"  phase: {name} (+{t - prev:.2f} s)", t, ""])
        prev = t
    print_table(["what", "best s", "median s"], rows)
    write_results(args.out, [runs], env, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
