"""Streaming against `complete()` through the public API, with the model's time taken out.

The engine runs as it does for a user (scheduler, detokenizer, outputs, the
hop to the event loop, `async for` over `generate()`), but its runner is a
stand-in whose step "runs on a device" for `--step-ms` (a sleep, as the wait
for a GPU's event is) and returns tokens of real text. So what is measured is
the host's work per streamed token, on the event loop and on the worker, and
what it does to throughput when the device is fast, as W1 qwen2.5-0.5b's is
on an H200 (about 1 ms a step). For each mode: output tokens/s, the event
loop thread's CPU time per token, the worker thread's, and the outputs the
consumers received (fewer than tokens when outputs are coalesced). Every
stream is checked: its deltas, joined, must equal its final `token_ids` and
`text`, with exactly `--max-tokens` tokens.

Each source tree runs in its own process (PYTHONPATH), so `--base DIR`
compares this tree against another checkout in one run:

    python benchmarks/bench_stream.py --base /tmp/stream-base   # writes benchmarks/results/stream_cpu.json
    python benchmarks/bench_stream.py --quick                    # smaller, for a smoke run
    python benchmarks/bench_stream.py --stream-interval 1,4,8    # EngineConfig.stream_interval, a child each
    python benchmarks/bench_stream.py --stream-interval-ms 0,20  # EngineConfig.stream_interval_ms, likewise
    python benchmarks/bench_stream.py --switch-interval 5,0.5    # sys.setswitchinterval (ms) in the child

On a GPU, the same effect through the real model is the suite's W1 streaming
figure: `python benchmarks/gpu_suite.py --only w1`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, environment, print_table, record, write_results  # noqa: E402


class _FakeRunner:
    """Stands in for `ModelRunner` under the worker: a step takes `step_s` and yields text tokens."""

    def __init__(self, real: Any, text_ids: list[int], step_s: float) -> None:
        self.device, self.stream = real.device, None
        self.text_ids, self.step_s, self.k = text_ids, step_s, 0

    def launch(self, step: Any) -> Any:
        import torch

        from radixserve.runtime.runner import StepHandle

        n = len(step.sampling)  # rows that sample a token this step
        self.k += 1
        ids = [self.text_ids[(self.k + j) % len(self.text_ids)] for j in range(n)]
        handle = StepHandle(next_ids=torch.tensor(ids, dtype=torch.int64), event=None)
        ready = time.perf_counter() + self.step_s
        real_result = handle.result

        def result() -> Any:
            left = ready - time.perf_counter()
            if left > 0:
                time.sleep(left)  # the device's step: the host waits without the GIL
            return real_result()

        handle.result = result  # type: ignore[method-assign]
        return handle


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def child(
    n: int, max_tokens: int, step_ms: float, rounds: int, switch_ms: float | None, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    from radixserve import AsyncEngine, EngineConfig, SamplingParams

    if switch_ms is not None:
        sys.setswitchinterval(switch_ms / 1e3)

    async def run() -> list[dict[str, Any]]:
        # A base tree runs with its own defaults (extra empty): it may not know the options.
        engine = AsyncEngine(EngineConfig(model="smollm2-135m-instruct", max_running_requests=n, **extra))
        async with engine:
            tok = engine.tokenizer
            text_ids = tok.encode(
                " ".join(f"Step {i}: the radix tree shares every prefix." for i in range(64))
            )
            worker = engine._worker
            assert worker is not None
            worker.runner = _FakeRunner(worker.runner, text_ids, step_ms / 1e3)  # type: ignore[assignment]
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
            prompts = [[100 + i, 200 + i, 300 + i] for i in range(n)]
            rows = []
            for _ in range(rounds):
                for mode in ("complete", "stream"):
                    rows.append(await one_run(engine, worker, prompts, params, mode, max_tokens))
            return rows

    async def one_run(
        engine: Any, worker: Any, prompts: Any, params: Any, mode: str, m: int
    ) -> dict[str, Any]:
        outputs = 0

        async def stream(p: list[int]) -> int:
            nonlocal outputs
            ids: list[int] = []
            text = ""
            async for out in engine.generate(p, params):
                outputs += 1
                ids.extend(out.delta_token_ids)
                text += out.delta_text
            assert out.finished and list(out.token_ids) == ids and out.text == text and len(ids) == m
            return len(ids)

        async def complete(p: list[int]) -> int:
            nonlocal outputs
            out = await engine.complete(p, params)
            outputs += 1
            assert len(out.token_ids) == m
            return len(out.token_ids)

        fn = stream if mode == "stream" else complete
        loop_thread = threading.current_thread()
        c0, w0, t0 = _thread_cpu(loop_thread), _thread_cpu(worker._thread), time.perf_counter()
        toks = sum(await asyncio.gather(*(fn(p) for p in prompts)))
        wall = time.perf_counter() - t0
        c1, w1 = _thread_cpu(loop_thread), _thread_cpu(worker._thread)
        return {
            "mode": mode,
            "requests": len(prompts),
            "max_tokens": m,
            "step_ms": step_ms,
            "switch_interval_ms": sys.getswitchinterval() * 1e3,
            "stream_interval": extra.get("stream_interval"),
            "stream_interval_ms": extra.get("stream_interval_ms"),
            "load_1min": os.getloadavg()[0],
            "tokens": toks,
            "tok_s": toks / wall,
            "loop_us_per_token": 1e6 * (c1 - c0) / toks,
            "worker_us_per_token": 1e6 * (w1 - w0) / toks,
            "outputs_per_token": outputs / toks,
        }

    return asyncio.run(run())


def run_tree(
    tree: Path, args: argparse.Namespace, switch_ms: float | None, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", "--requests", str(args.requests)]
    cmd += [
        "--max-tokens",
        str(args.max_tokens),
        "--step-ms",
        str(args.step_ms),
        "--rounds",
        str(args.rounds),
    ]
    if switch_ms is not None:
        cmd += ["--switch-interval", str(switch_ms)]
    cmd += ["--engine-json", json.dumps(extra)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return list(json.loads(out.strip().splitlines()[-1]))


def best(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The round with the highest throughput of `mode` (the least disturbed by other load)."""
    return max((r for r in rows if r["mode"] == mode), key=lambda r: r["tok_s"])


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="the source tree to compare against (e.g. a main checkout)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=1.0, help="the stand-in device's time per step")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--switch-interval",
        help="CPython's GIL switch interval in ms, set in the child before the engine starts; "
        "a comma-separated list runs one child per value (default: the interpreter's own)",
    )
    ap.add_argument(
        "--stream-interval",
        help="EngineConfig.stream_interval of this tree; a comma-separated list runs one child per "
        "value (the base tree runs with its own default)",
    )
    ap.add_argument(
        "--stream-interval-ms",
        help="EngineConfig.stream_interval_ms of this tree, likewise (default: the tree's own)",
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engine-json", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/stream_cpu.json")
    args = ap.parse_args()
    switches: list[float | None] = list(_floats(args.switch_interval)) if args.switch_interval else [None]
    intervals = [int(v) for v in args.stream_interval.split(",")] if args.stream_interval else [None]
    gaps = _floats(args.stream_interval_ms) if args.stream_interval_ms else [None]
    if args.child:
        extra = json.loads(args.engine_json)
        rows = child(args.requests, args.max_tokens, args.step_ms, args.rounds, switches[0], extra)
        print(json.dumps(rows))
        return
    if args.quick:
        args.requests, args.max_tokens, args.rounds = 16, 16, 1
    env = environment()
    trees = [("this", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    runs: list[tuple[str, Path, float | None, dict[str, Any]]] = (
        [("base", trees[1][1], sw, {}) for sw in switches] if args.base else []
    )
    for sw in switches:
        for si in intervals:
            for gap in gaps:
                extra = {
                    k: v for k, v in (("stream_interval", si), ("stream_interval_ms", gap)) if v is not None
                }
                runs.append(("this", ROOT, sw, extra))
    results, table = [], []
    for name, tree, sw, extra in runs:
        rows = run_tree(tree, args, sw, extra)
        for r in rows:
            results.append(
                record("stream_vs_complete", "fake runner (smollm2 tokenizer)", "-", "cpu", r, tree=name)
            )
        c, s = best(rows, "complete"), best(rows, "stream")
        for r in (c, s):
            cells = [r["tok_s"], r["loop_us_per_token"], r["worker_us_per_token"], r["outputs_per_token"]]
            ratio = s["tok_s"] / c["tok_s"] if r is s else None
            row = [name, r["mode"], r["step_ms"], r["switch_interval_ms"], r["stream_interval"]]
            row.append(r["stream_interval_ms"])
            table.append([*row, *cells, ratio])
    heads = [
        "tree",
        "mode",
        "step ms",
        "switch ms",
        "stream interval",
        "interval ms",
        "tok/s",
        "loop µs/token",
    ]
    heads += ["worker µs/token", "outputs/token", "stream/complete"]
    print(f"{args.requests} requests x {args.max_tokens} tokens; best of {args.rounds} rounds per mode;")
    print("thread CPU time per output token")
    print_table(heads, table)
    trees_doc = {name: str(tree) for name, tree in trees}
    print(f"wrote {write_results(args.out, results, env, trees=trees_doc)}")


if __name__ == "__main__":
    main()
