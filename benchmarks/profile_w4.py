"""What W4's slow steps are made of: a step trace under Poisson arrivals (a diagnostic tool).

    python benchmarks/profile_w4.py [--model dummy:llama-3.1-8b] [--rate 16] [--n 256] [--set FIELD=VALUE]

Runs W4's requests (W1 lengths, streamed, Poisson arrivals at `--rate`
req/s) and records every step the worker takes: its decode rows, its
prefill tokens, the host time of its launch, and its period (the time
between the ends of consecutive steps, which is the device's step time when
the device is the bottleneck). Printed: the streamed TTFT / TBT p50 and p99,
and the steps binned by prefill tokens (count, median and p90 period, median
launch time), so one sees whether the TBT tail is prefill compute (period
growing with the tokens) or a fixed cost of leaving the decode graph. JSON to
`--out`. The suite's `w4` section is the figure of record.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import provenance, w1_requests  # noqa: E402
from benchmarks.suite.engines import make_target, p50_p99_ms, run_offline, run_streaming, running_engine  # noqa: E402
from benchmarks.suite.workloads import poisson_delays  # noqa: E402

BINS = (0, 1, 257, 513, 1025, 2049, 1 << 30)  # prefill tokens: [lo, next lo)


class StepTrace:
    """Wraps the worker's launch and finish: one row per step."""

    def __init__(self, worker: Any, python: bool = False) -> None:
        """`python`: cProfile the launches of steps that carry prefill tokens."""
        self.py = cProfile.Profile() if python else None
        self.rows: list[dict[str, float]] = []
        self.last_end = 0.0
        self.pending: dict[int, dict[str, float]] = {}
        launch, finish = worker._launch, worker._finish_step

        def traced_launch(batch: Any) -> Any:
            py = self.py if batch.is_prefill else None
            t0 = time.perf_counter()
            if py is not None:
                py.enable()
            out = launch(batch)
            if py is not None:
                py.disable()
            lens = batch.step.extend_lens.tolist()
            prefill = sum(n for n in lens if n > 1)
            self.pending[id(batch)] = {
                "decode_rows": float(sum(1 for n in lens if n == 1)),
                "prefill_tokens": float(prefill),
                "graph": float(not batch.is_prefill),
                "launch_ms": 1000 * (time.perf_counter() - t0),
            }
            return out

        def traced_finish(batch: Any, handle: Any) -> None:
            finish(batch, handle)
            now = time.perf_counter()
            row = self.pending.pop(id(batch), None)
            if row is not None and self.last_end:
                row["period_ms"] = 1000 * (now - self.last_end)
                self.rows.append(row)
            self.last_end = now

        worker._launch, worker._finish_step = traced_launch, traced_finish


def binned(rows: list[dict[str, float]]) -> list[dict[str, Any]]:
    out = []
    for lo, hi in zip(BINS, BINS[1:]):
        sel = [r for r in rows if lo <= r["prefill_tokens"] < hi]
        if not sel:
            continue
        per = sorted(r["period_ms"] for r in sel)
        out.append(
            {
                "prefill_tokens": f"{lo}-{hi - 1}" if hi < 1 << 30 else f">={lo}",
                "steps": len(sel),
                "decode_rows_median": statistics.median(r["decode_rows"] for r in sel),
                "period_p50_ms": statistics.median(per),
                "period_p90_ms": per[int(0.9 * (len(per) - 1))],
                "launch_p50_ms": statistics.median(r["launch_ms"] for r in sel),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama-3.1-8b")
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--set", action="append", default=[], help="EngineConfig FIELD=VALUE (int/float/str)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lo", type=int, default=100)
    ap.add_argument("--hi", type=int, default=1024)
    ap.add_argument("--python", action="store_true", help="cProfile the launches of prefill-carrying steps")
    ap.add_argument("--out", default="benchmarks/results/profile_w4.json")
    args = ap.parse_args()
    target = make_target(args.device)
    # W4's streams take every token (as the suite's W4), unless --set says otherwise.
    overrides: dict[str, Any] = {"stream_interval_ms": 0}
    for kv in args.set:
        k, v = kv.split("=", 1)
        overrides[k] = (
            int(v) if v.lstrip("-").isdigit() else (float(v) if v.replace(".", "", 1).isdigit() else v)
        )
    reqs = w1_requests(args.n, args.lo, args.hi, target.vocab(args.model))
    with running_engine(target.config(args.model, **overrides)) as (engine, loop):
        run_offline(engine, loop, reqs[:8])
        loop.run_until_complete(engine.flush_cache())
        trace = StepTrace(engine._worker, args.python)
        streamed = run_streaming(engine, loop, reqs, poisson_delays(len(reqs), args.rate))
    ttft, tbt = p50_p99_ms(streamed.ttft), p50_p99_ms(streamed.tbt)
    table = binned(trace.rows)
    print(
        f"rate {args.rate}/s, {len(trace.rows)} steps: TTFT p50/p99 {ttft[0]:.1f}/{ttft[1]:.1f} ms, "
        f"TBT p50/p99 {tbt[0]:.2f}/{tbt[1]:.2f} ms"
    )
    print("| prefill tokens | steps | decode rows (median) | period p50 ms | period p90 ms | launch p50 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b in table:
        print(
            f"| {b['prefill_tokens']} | {b['steps']} | {b['decode_rows_median']:.0f} | "
            f"{b['period_p50_ms']:.2f} | {b['period_p90_ms']:.2f} | {b['launch_p50_ms']:.2f} |"
        )
    python = ""
    if trace.py is not None:
        buf = io.StringIO()
        pstats.Stats(trace.py, stream=buf).sort_stats("tottime").print_stats(30)
        python = buf.getvalue()
        print(python[:6000])
    result = {
        "python_profile": python,
        **provenance(),
        "model": args.model,
        "rate": args.rate,
        "overrides": overrides,
        "ttft_ms": ttft,
        "tbt_ms": tbt,
        "bins": table,
        "steps": trace.rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
