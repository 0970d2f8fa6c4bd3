"""Where a steady decode step's time goes, on the host and on the device (torch.profiler).

    python benchmarks/profile_decode.py [--model dummy:qwen2.5-0.5b] [--batch 32,256] [--ctx 1024]
    # W1L 1000/1000's steady decode with FP8 weights and an FP8 KV cache (contexts ~1,000-2,000):
    python benchmarks/profile_decode.py --model dummy:llama-3.1-8b --batch 256 --ctx 1500 \
        --quantization fp8 --set kv_cache_dtype=fp8_e4m3

For each batch size, B requests of `--ctx` random prompt tokens decode; once
every request is decoding, `--steps` decode steps are recorded with
torch.profiler on the worker thread (CPU ops and CUDA kernels). Printed per
batch: the ops with the most self CPU time, the kernels with the most device
time, and per step: wall time, device busy time (kernel time summed) and the
idle fraction. JSON (the per-op tables) goes to `--out`. A diagnostic tool
for issue work: the suite's `host` section is the figure of record.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import provenance  # noqa: E402
from benchmarks.suite.engines import make_target, parse_override, run_offline, running_engine  # noqa: E402


class DecodeProfiler:
    """Wraps the worker's launch: profiles decode steps `skip`..`skip+steps` of full batches."""

    def __init__(self, worker: Any, batch_size: int, skip: int, steps: int, python: bool = False) -> None:
        """`python`: cProfile the worker's Python functions instead of torch.profiler."""
        self.batch_size, self.skip, self.steps, self.python = batch_size, skip, steps, python
        self.py: cProfile.Profile | None = None
        self.seen = 0
        self.prof: torch.profiler.profile | None = None
        self.t0 = self.t1 = 0.0
        self.done = False
        orig = worker._launch

        def launch(batch: Any, *a: Any, **kw: Any) -> Any:
            full = batch.step.is_decode and len(batch.reqs) == self.batch_size
            if full and not self.done:
                if self.seen == self.skip and self.python:
                    self.py = cProfile.Profile()
                    self.py.enable()
                    self.t0 = time.perf_counter()
                elif self.seen == self.skip:
                    acts = [torch.profiler.ProfilerActivity.CPU]
                    if torch.cuda.is_available():
                        acts.append(torch.profiler.ProfilerActivity.CUDA)
                    self.prof = torch.profiler.profile(activities=acts)
                    self.prof.__enter__()
                    self.t0 = time.perf_counter()
                self.seen += 1
            out = orig(batch, *a, **kw)
            if self.py is not None and not self.done and self.seen == self.skip + self.steps + 1:
                self.py.disable()
                self.t1 = time.perf_counter()
                self.done = True
            if self.prof is not None and not self.done and self.seen == self.skip + self.steps + 1:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.t1 = time.perf_counter()
                self.prof.__exit__(None, None, None)
                self.done = True
            return out

        worker._launch = launch


def summarize(p: DecodeProfiler, top: int) -> dict[str, Any]:
    assert p.prof is not None
    ev = p.prof.key_averages()
    cpu = sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    dev = sorted(ev, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:top]
    busy_us = sum(getattr(e, "self_device_time_total", 0) for e in ev)
    n = p.steps + 1  # the wrapper stops after the launch following the last profiled step
    wall_ms = 1000 * (p.t1 - p.t0) / n
    return {
        "steps": n,
        "wall_ms_per_step": round(wall_ms, 3),
        "device_busy_ms_per_step": round(busy_us / 1000 / n, 3),
        "device_idle_fraction": round(max(0.0, 1 - busy_us / 1000 / n / wall_ms), 3),
        "cpu_ops": [
            {"name": e.key, "calls": e.count, "self_cpu_us_per_step": round(e.self_cpu_time_total / n, 1)}
            for e in cpu
        ],
        "kernels": [
            {
                "name": e.key[:90],
                "calls": e.count,
                "device_us_per_step": round(getattr(e, "self_device_time_total", 0) / n, 1),
            }
            for e in dev
            if getattr(e, "self_device_time_total", 0) > 0
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--batch", default="32,256")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=22)
    # On the device machine $OUT is the folder that comes back; a path under the tree would not.
    default_out = Path(os.environ["OUT"]) / "profile_decode.json" if "OUT" in os.environ else None
    ap.add_argument("--out", default=str(default_out or "benchmarks/results/profile_decode.json"))
    ap.add_argument("--quantization", choices=["fp8"], default=None, help="EngineConfig.quantization")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an EngineConfig field, e.g. kv_cache_dtype=fp8_e4m3 (recorded in the JSON)",
    )
    args = ap.parse_args()
    overrides = tuple(parse_override(kv) for kv in args.set)
    t = replace(make_target("auto"), quantization=args.quantization, overrides=overrides)
    spec = args.model or t.small
    vocab = t.vocab(spec)
    sizes = [int(b) for b in args.batch.split(",")]
    rng = random.Random(3)
    results = []
    with running_engine(t.config(spec, max_running_requests=max(256, *sizes))) as (engine, loop):
        run_offline(engine, loop, [([1, 2, 3, 4], 4)] * 2)
        for bs in sizes:
            worker: Any = engine._worker  # private on purpose: a diagnostic
            base_launch = worker._launch
            p = DecodeProfiler(worker, bs, skip=20, steps=args.steps)
            reqs = [([rng.randrange(vocab) for _ in range(args.ctx)], 80 + args.steps) for _ in range(bs)]
            loop.run_until_complete(engine.flush_cache())
            run_offline(engine, loop, reqs)
            worker._launch = base_launch
            if p.prof is None or not p.done:
                slots = loop.run_until_complete(engine.stats())["total_slots"]
                need = bs * (args.ctx + 80 + args.steps)
                why = f"; the KV pool holds {slots} tokens, the batch needs {need}" if need > slots else ""
                print(f"batch {bs}: not enough full decode steps seen ({p.seen}){why}")
                continue
            s = summarize(p, args.top)
            q = DecodeProfiler(worker, bs, skip=20, steps=args.steps, python=True)
            loop.run_until_complete(engine.flush_cache())
            run_offline(engine, loop, reqs)
            worker._launch = base_launch
            if q.py is not None:
                buf = io.StringIO()
                pstats.Stats(q.py, stream=buf).sort_stats("tottime").print_stats(args.top)
                s["python_wall_ms_per_step"] = round(1000 * (q.t1 - q.t0) / (args.steps + 1), 3)
                s["python_profile"] = buf.getvalue()
            s["batch"] = bs
            results.append(s)
            print(
                f"\n== batch {bs} ctx {args.ctx}: wall {s['wall_ms_per_step']} ms/step, device busy "
                f"{s['device_busy_ms_per_step']} ms/step, idle {s['device_idle_fraction']:.0%}"
            )
            print(f"{'self CPU us/step':>16}  {'calls':>6}  op")
            for r in s["cpu_ops"]:
                print(f"{r['self_cpu_us_per_step']:>16}  {r['calls']:>6}  {r['name'][:100]}")
            print(f"{'device us/step':>16}  {'calls':>6}  kernel")
            for r in s["kernels"]:
                print(f"{r['device_us_per_step']:>16}  {r['calls']:>6}  {r['name']}")
            if "python_profile" in s:
                ms = s["python_wall_ms_per_step"]
                print(f"cProfile of {args.steps + 1} steps ({ms} ms/step under it):")
                print(s["python_profile"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = {"provenance": provenance(), "model": spec, "quantization": args.quantization}
    head["engine_overrides"] = dict(overrides)
    out.write_text(json.dumps({**head, "results": results}, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
