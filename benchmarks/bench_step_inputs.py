"""A decode step's small ops outside the graph, before vs after, in one run (device auto).

1. Sampling an all-greedy step on [bs, vocab] logits (bfloat16 and float32): the previous ops
   (`logits[:, :V].float()`, `argmax`, `isfinite(...).all(-1)`, `where`) against the
   sampler's one-reduction path (`Sampler.__call__`, `max(dim)` on the logits' own dtype).
2. CUDA only (a Triton kernel): building the step's inputs for graph `bs`: `build_decode_batch`
   plus `DecodeGraphs.run`'s copies and padding (the graph itself stubbed out) against one
   packed pinned copy and one `step_fill` launch.

"host" is the wall time of the calls' Python and launches (no sync inside the loop), "total"
the time per call with the device drained at the end (CUDA: the device time once the host
runs ahead). On the CPU both are the ops themselves: a sanity figure only.

    python benchmarks/bench_step_inputs.py          # writes benchmarks/results/step_inputs_<device>.json
    python benchmarks/bench_step_inputs.py --quick  # small shapes, a smoke run

Part 2 also checks that both give the same inputs (on the GPU: the compiled kernel). With
TRITON_INTERPRET=1 it runs on the CPU too, as a check of the script only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, environment, print_table, record, write_results  # noqa: E402

from radixserve.runtime.sampler import INVALID_TOKEN, Sampler, SamplingInputs  # noqa: E402
from radixserve.sampling_params import SamplingParams  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], iters: int, device: torch.device) -> tuple[float, float]:
    """(host ms, total ms) per call, after two warm-up calls."""
    for _ in range(2):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    sync(device)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0) / iters, 1e3 * (t2 - t0) / iters


def previous_greedy(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """The all-greedy path before the fast path: a float copy, argmax, isfinite over every entry."""
    raw = logits[:, :vocab].float()
    return torch.where(torch.isfinite(raw).all(dim=-1), raw.argmax(dim=-1), INVALID_TOKEN)


def bench_sampler(bs: int, vocab: int, iters: int, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    n = bs
    inp = SamplingInputs.from_requests(
        list(range(n)), [SamplingParams(temperature=0)] * n, [0] * n, [frozenset()] * n
    )
    sampler = Sampler(vocab, n, device)
    sampler(torch.zeros(n, vocab, device=device), inp)  # writes the rows' parameters once
    inp.init = []
    dev_rows = torch.arange(n, device=device)
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(n, vocab, device=device).to(dtype)
        assert torch.equal(sampler(logits, inp, dev_rows).next_ids, previous_greedy(logits, vocab))
        before = timed(lambda lg=logits: previous_greedy(lg, vocab), iters, device)  # type: ignore[misc]
        after = timed(lambda lg=logits: sampler(lg, inp, dev_rows), iters, device)  # type: ignore[misc]
        name = str(dtype).removeprefix("torch.")
        for setting, (host, total) in (("before", before), ("after", after)):
            rows.append({"part": "greedy sample", "dtype": name, "setting": setting, "host_ms": host})
            rows[-1].update(total_ms=total, batch=bs, vocab=vocab)
    return rows


class _PlanStub:
    """Stands in for FlashInfer's decode: keeps the batch the graph would be planned with."""

    batch: Any = None
    device_planned = False
    cascade_graphs = False

    def decode_graphs(self) -> _PlanStub:
        return self

    def plan_cuda_graph(self, state: Any, batch: Any) -> None:
        self.batch = batch


def bench_fill(bs: int, ctx: int, iters: int, device: torch.device) -> list[dict[str, Any]]:
    from radixserve.runtime.cuda_graph import DecodeGraphs
    from radixserve.runtime.sampler import SamplingInputs
    from radixserve.runtime.step import StepInput
    from radixserve.runtime.step_batch import build_decode_batch
    from radixserve.runtime.step_fill import StepFillStaging, step_fill

    rng = np.random.default_rng(0)
    n = bs - 3  # a few padding rows, as most steps have
    scratch = bs * (ctx + 8)
    prefix = rng.integers(ctx // 2, ctx, n)
    rows = rng.permutation(bs)[:n].astype(np.int64)
    inp = StepInput.decode(
        rows,
        prefix.astype(np.int64),
        rng.integers(0, scratch, n),
        np.where(rng.random(n) < 0.5, -1, rng.integers(0, 1000, n)),
        SamplingInputs(rows, [], 0),
    )
    table = torch.randint(0, scratch, (bs, ctx + 8), dtype=torch.int32, device=device)
    last = torch.randint(0, 1000, (bs,), device=device)
    total = int(prefix.sum()) + bs
    plan = _PlanStub()
    graphs = DecodeGraphs(torch.nn.Identity(), plan, bs, total, scratch, device)  # type: ignore[arg-type]
    graphs.graphs[bs] = SimpleNamespace(replay=lambda: None)  # type: ignore[assignment]
    graphs.logits[bs], graphs.states[bs] = torch.zeros(bs, 1, device=device), None

    def before() -> None:
        graphs.run(build_decode_batch(inp, table, last, device))

    staging = StepFillStaging(bs, device)
    ids, pos, slots = (torch.zeros(bs, dtype=torch.int64, device=device) for _ in range(3))
    indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    indices = torch.zeros(total, dtype=torch.int32, device=device)
    bufs = (ids, pos, slots, indptr, indices)

    def after() -> None:
        step_fill(staging.upload(inp), bs, last, table, *bufs, scratch=scratch)

    rows = []
    for setting, fn in (("before", before), ("after", after)):
        host, total_ms = timed(fn, iters, device)
        rows.append({"part": "decode inputs", "dtype": "-", "setting": setting, "host_ms": host})
        rows[-1].update(total_ms=total_ms, batch=bs, ctx=ctx)
    # Same inputs both ways (the table writes are the same each call, so repeating them is harmless).
    want = plan.batch
    lens = torch.tensor([0, *want.prefix_lens]) + 1
    lens[0] = 0
    for name, got, ref in (
        ("input_ids", ids, want.input_ids),
        ("positions", pos, want.positions),
        ("out_slots", slots, want.out_slots),
        ("kv_indptr", indptr, lens.cumsum(0).to(torch.int32)),
        ("kv_indices", indices, want.kv_indices),
    ):
        assert torch.equal(got.cpu(), ref.cpu()), f"step_fill's {name} differs from the torch path"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bs", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--ctx", type=int, default=2048, help="decode inputs: context length per request")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    if device.type == "cpu":
        torch.set_num_threads(1)  # one host thread, as the worker's small ops run
        args.iters = min(args.iters, 5)
    if args.quick:
        args.bs, args.vocab, args.ctx, args.iters = 16, 4096, 128, 3
    env = environment()
    rows = bench_sampler(args.bs, args.vocab, args.iters, device)
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        rows += bench_fill(args.bs, args.ctx, args.iters, device)
    table = []
    for i in range(0, len(rows), 2):
        b, a = rows[i], rows[i + 1]
        for r in (b, a):
            ratio = (b["host_ms"] / a["host_ms"], b["total_ms"] / a["total_ms"]) if r is a else (None, None)
            table.append(
                [r["part"], r["dtype"], r["batch"], r["setting"], r["host_ms"], r["total_ms"], *ratio]
            )
    heads = ["part", "dtype", "batch", "setting", "host ms", "total ms", "host speedup", "total speedup"]
    print(f"per call on {device} (ms)")
    print_table(heads, table)
    out = (
        args.out
        or ROOT / f"benchmarks/results/step_inputs_{device.type}{'_quick' if args.quick else ''}.json"
    )
    results = [record("step_inputs", "none (random logits)", r["dtype"], device.type, r) for r in rows]
    print(f"wrote {write_results(out, results, env)}")


if __name__ == "__main__":
    main()
