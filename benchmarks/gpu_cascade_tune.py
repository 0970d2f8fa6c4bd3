"""The Triton cascade's launch choices on W5's shape, swept on the GPU: one run, one table.

    source scripts/gpu_env.sh && PYTHONUNBUFFERED=1 python3 benchmarks/gpu_cascade_tune.py

W5 (BENCHMARKS.md): N requests sharing a 4096-token prefix, here at the
workload's middle step (8 + 128 own tokens each), Llama-3.1-8B's heads (32
query, 8 KV heads of 128), bfloat16, every one of the 32 layers its own K/V
buffers (so the prefix is not served from L2). For N = 16 and 64 it times the
32 layers' decode attention inside one CUDA graph (median of 7 replays, the
suite's `device_ms`):

- plain decode (`decode_attention`, the engine's tiling), the "off" figure;
- the cascade (`run_levels`) for each level-0 launch choice: prefix splits,
  query block rows, key tile, warps and pipelining stages, each checked
  against plain decode (relative error under the bfloat16 bound);
- for the engine's current choice and the sweep's best, the three kernels
  apart (level 1 over the suffixes, level 0 over the prefix, the merge).

Prints the table last and writes $OUT/cascade_tune.json.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import print_table, provenance  # noqa: E402
from benchmarks.suite.decode import device_ms  # noqa: E402
from radixserve.runtime.attention import cascade_items as ci  # noqa: E402
from radixserve.runtime.attention import triton_cascade as tc  # noqa: E402
from radixserve.runtime.attention import triton_kernels as tk  # noqa: E402
from radixserve.runtime.attention.triton_decode import decode_tiling  # noqa: E402
from radixserve.runtime.cascade import CascadeGroups  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
HEADS, KV_HEADS, DIM, LAYERS = 32, 8, 128, 32
PREFIX, OWN = 4096, 8 + 128
BF16_TOL = 1.5e-2


def graph_ms(fn: Callable[[], object]) -> float:
    """Median device ms of 7 replays of `fn` captured in a CUDA graph."""
    return device_ms(fn, torch.device("cuda"), replays=7)[0]


class W5Step:
    """N rows of one group: its K/V per layer, page table, queries and cascade groups."""

    def __init__(self, n: int) -> None:
        self.n = n
        slots = PREFIX + n * OWN
        dev = torch.device("cuda")
        self.kv = [
            (
                torch.randn(slots, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16),
                torch.randn(slots, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16),
            )
            for _ in range(LAYERS)
        ]
        shared = torch.arange(PREFIX)
        ctx = [torch.cat([shared, PREFIX + i * OWN + torch.arange(OWN)]) for i in range(n)]
        self.seq = torch.tensor([len(c) for c in ctx])
        indptr = torch.zeros(n + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(self.seq, 0)
        self.table = (indptr.to(dev), torch.cat(ctx).to(torch.int32).to(dev))
        self.q = torch.randn(n, HEADS, DIM, device=dev, dtype=torch.bfloat16)
        self.groups = CascadeGroups((tuple(range(n)),), (PREFIX,))
        self.scale = DIM**-0.5
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count

    def plain(self) -> tuple[float, torch.Tensor]:
        tiling = decode_tiling(self.n, KV_HEADS, self.sms, int(self.seq.max()))
        ms = graph_ms(
            lambda: [tk.decode_attention(self.q, kv, self.table, self.scale, tiling) for kv in self.kv]
        )
        return ms, tk.decode_attention(self.q, self.kv[0], self.table, self.scale, tiling)

    def launch(self, splits: int, block_m: int, block_n: int, warps: int, stages: int) -> Any:
        starts = ci.context_starts(self.seq.numpy())
        work = ci.cascade_items(self.groups, starts, HEADS // KV_HEADS, block_m, 1 << 20, splits)
        tiling = decode_tiling(self.n, KV_HEADS, self.sms, OWN)
        launch = tc.CascadeLaunch(
            self.scale, tiling, work.splits, work.num_items, block_m, block_n, warps, stages
        )
        host = torch.zeros(ci.packed_size(self.n, work.num_items), dtype=torch.int32)
        ci.pack(work, self.n, work.num_items, host.numpy())
        return launch, ci.views(host.cuda(), self.n, work.num_items)

    def cascade(self, launch: Any, work: Any) -> tuple[float, torch.Tensor]:
        ms = graph_ms(lambda: [tc.run_levels(self.q, kv, self.table, work, launch) for kv in self.kv])
        return ms, tc.run_levels(self.q, self.kv[0], self.table, work, launch)

    def parts(self, launch: Any, work: Any) -> dict[str, float]:
        """Each of the three kernels over the 32 layers, apart."""
        skip, rows, items = work
        s1 = launch.suffix_tiling.splits
        mid = tk.new_partials(self.q, s1 + launch.prefix_splits)
        out = torch.empty_like(self.q)
        return {
            "level1_ms": graph_ms(
                lambda: [
                    tk.decode_partials(self.q, kv, self.table, self.scale, launch.suffix_tiling, mid, skip)
                    for kv in self.kv
                ]
            ),
            "level0_ms": graph_ms(
                lambda: [
                    tc.prefix_level(self.q, kv, rows, items, self.table[1], mid, launch) for kv in self.kv
                ]
            ),
            "merge_ms": graph_ms(lambda: [tk.reduce_partials(mid, out) for _ in self.kv]),
        }


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def sweep(n: int) -> dict[str, Any]:
    step = W5Step(n)
    off_ms, ref = step.plain()
    bm = tc.block_m_for(n * HEADS // KV_HEADS)
    shape = tc.CascadeShape(KV_HEADS, HEADS // KV_HEADS, step.scale, 128, step.sms)
    starts = ci.context_starts(step.seq.numpy())
    eager = ci.cascade_items(step.groups, starts, shape.group, bm, shape.target_items, tc._MAX_PREFIX_SPLITS)
    current = (eager.splits, bm, 128, tc.prefix_warps_for(bm), 3)  # TritonCascadePlan's choice
    block_ms = (64,) if n * HEADS // KV_HEADS <= 64 else (64, 128)
    rows = []
    for splits, block_m, block_n, warps, stages in itertools.product(
        (4, 8, 16, 32), block_ms, (64, 128), (4, 8), (2, 3)
    ):
        if block_m == 128 and warps == 4:
            continue  # a 128 x 128 fp32 accumulator does not fit 4 warps' registers
        cfg = (splits, block_m, block_n, warps, stages)
        try:
            launch, work = step.launch(*cfg)
            ms, out = step.cascade(launch, work)
            rows.append({"cfg": cfg, "ms": ms, "err": rel_err(out, ref)})
            print(f"N={n} {cfg}: {ms:.4f} ms, off/on {off_ms / ms:.3f}, rel err {rows[-1]['err']:.1e}")
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a result
            rows.append({"cfg": cfg, "ms": None, "err": None, "error": f"{type(e).__name__}: {str(e)[:120]}"})
    good = [r for r in rows if r["ms"] is not None and r["err"] < BF16_TOL]
    best = min(good, key=lambda r: r["ms"])
    parts = {}
    for label, cfg in (("current", current), ("best", best["cfg"])):
        launch, work = step.launch(*cfg)
        parts[label] = {"cfg": cfg, **step.parts(launch, work)}
    return {"n": n, "off_ms": off_ms, "rows": rows, "best": best, "parts": parts}


def main() -> None:
    torch.manual_seed(0)
    results = [sweep(n) for n in (16, 64)]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cascade_tune.json").write_text(
        json.dumps({"provenance": provenance(), "results": results}, indent=1)
    )
    for r in results:
        print(f"\nN={r['n']}: plain decode {r['off_ms']:.3f} ms for {LAYERS} layers")
        table = sorted((x for x in r["rows"] if x["ms"] is not None), key=lambda x: x["ms"])
        print_table(
            ["splits", "block_m", "block_n", "warps", "stages", "ms", "off/on", "rel err"],
            [
                [*x["cfg"], round(x["ms"], 4), round(r["off_ms"] / x["ms"], 3), f"{x['err']:.1e}"]
                for x in table[:12]
            ],
        )
        for x in r["rows"]:
            if x["ms"] is None:
                print("failed", x["cfg"], x["error"])
        for label, p in r["parts"].items():
            print(label, p)


if __name__ == "__main__":
    main()
