"""The fused MoE layer (radixserve/runtime/fused_moe.py) against its weight-read time, per tile choice.

For a model shape's expert sizes (default qwen3-30b-a3b: 128 experts of 768, 8 per token,
hidden 2048) and decode-sized token counts, times one layer's `fused_moe` replayed from a
CUDA graph as a decode step runs it (CUDA events, the median of `--iters` replays, routing
drawn uniformly) for each tile setting, each part of the layer (router, align, the two GEMMs,
activation, the sum over k) at the default tiles, and the
bound: the bytes of the experts the step touches over the HBM bandwidth (`--tb-s`, 4.8 for an
H200) or, where larger, the GEMMs' FLOPs at `--tflops` (989: H100 and H200 dense bf16), which
is what bounds prefill-sized steps. Prints a table (best setting per token count last) and
writes JSON.

    python benchmarks/bench_fused_moe.py --out "$OUT"            # on the GPU machine
    python benchmarks/bench_fused_moe.py --tokens 2048,8192 --block-m 32,64,128 --warps 4,8
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import astuple
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_timing import graph_ms  # noqa: E402
from radixserve.runtime.fused_moe import Tiles, block_m_for, fused_moe, grouped_gemm, tiles_for  # noqa: E402
from radixserve.runtime.kernels import TORCH_KERNELS  # noqa: E402
from radixserve.runtime.moe_align import align  # noqa: E402
from radixserve.runtime.moe_route import route_topk  # noqa: E402


def breakdown(x, logits, top_k, w13, w2, block_m, iters):  # type: ignore[no-untyped-def]
    """Milliseconds of each part of one MoE layer (graph-replayed), for the default tiles."""
    top_idx, top_w = route_topk(logits, top_k, True)
    al = align(top_idx, w13.shape[0], block_m)
    tiles = tiles_for(block_m)
    h = grouped_gemm(x, w13, al, top_k, a_by_token=True, tiles=tiles)
    act = TORCH_KERNELS.silu_and_mul(h)
    w = top_w.reshape(-1).to(torch.float32)
    y = grouped_gemm(act, w2, al, top_k, a_by_token=False, scale=w, tiles=tiles)
    parts = {
        "route": lambda: route_topk(logits, top_k, True),
        "align": lambda: align(top_idx, w13.shape[0], block_m),
        "gemm_gate_up": lambda: grouped_gemm(x, w13, al, top_k, a_by_token=True, tiles=tiles),
        "act_and_mul": lambda: TORCH_KERNELS.silu_and_mul(h),
        "gemm_down": lambda: grouped_gemm(act, w2, al, top_k, a_by_token=False, scale=w, tiles=tiles),
        "sum_k": lambda: y.view(x.shape[0], top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype),
    }
    return {name: graph_ms(fn, iters) for name, fn in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--tokens", default="64,256")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--tb-s", type=float, default=4.8)
    ap.add_argument("--tflops", type=float, default=989.0, help="dense bf16 peak (compute bound)")
    ap.add_argument("--block-m", default="16,32,64", help="rows per block to sweep")
    ap.add_argument("--warps", default="4", help="num_warps to sweep")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    e, k, h, i = args.experts, args.top_k, args.hidden, args.inter
    w13 = torch.randn(e, 2 * i, h, device=dev, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(e, h, i, device=dev, dtype=torch.bfloat16) * 0.02
    expert_bytes = (w13[0].numel() + w2[0].numel()) * 2
    rows = []
    settings = [
        (bm, Tiles(bn, bk, warps, stages))
        for bm, (bn, bk), warps, stages in itertools.product(
            map(int, args.block_m.split(",")),
            ((64, 64), (64, 128), (128, 64), (128, 128)),
            map(int, args.warps.split(",")),
            (3, 4),
        )
    ]
    parts = {}
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
        top_idx = torch.rand(t, e, device=dev).topk(k, dim=-1).indices
        top_w = torch.full((t, k), 1.0 / k, device=dev, dtype=torch.bfloat16)
        touched = int(torch.unique(top_idx).numel())
        logits = torch.randn(t, e, device=dev, dtype=torch.bfloat16)
        parts[t] = breakdown(x, logits, k, w13, w2, block_m_for(t * k, e), args.iters)
        memory_ms = touched * expert_bytes / (args.tb_s * 1e12) * 1e3
        compute_ms = 2 * t * k * 3 * h * i / (args.tflops * 1e12) * 1e3  # gate, up and down
        bound_ms = max(memory_ms, compute_ms)
        for bm, tiles in settings:
            try:
                ms = graph_ms(
                    lambda: fused_moe(x, top_idx, top_w, w13, w2, TORCH_KERNELS.silu_and_mul, bm, tiles),  # noqa: B023
                    args.iters,
                )
            except Exception as err:  # noqa: BLE001 - a tile setting the GPU cannot run (shared memory)
                print(f"tokens={t} bm={bm} {tiles}: {type(err).__name__}", flush=True)
                continue
            rows.append(
                {
                    "tokens": t,
                    "block_m": bm,
                    **tiles.__dict__,
                    "ms": ms,
                    "bound_ms": bound_ms,
                    "of_bound": bound_ms / ms,
                }
            )
    best = {}
    for r in rows:
        if r["tokens"] not in best or r["ms"] < best[r["tokens"]]["ms"]:
            best[r["tokens"]] = r
    default = {
        r["tokens"]: r
        for r in rows
        if r["block_m"] == block_m_for(r["tokens"] * k, e)
        and (r["block_n"], r["block_k"], r["num_warps"], r["num_stages"]) == astuple(tiles_for(r["block_m"]))
    }
    print("| tokens | part | ms (default tiles, graph-replayed) |")
    print("|---|---|---|")
    for t, ms_of in parts.items():
        for name, ms in ms_of.items():
            print(f"| {t} | {name} | {ms:.4f} |")
        print(f"| {t} | sum of parts | {sum(ms_of.values()):.4f} |")
    print("| tokens | best setting | ms | bound ms | of bound | default ms | default of bound |")
    print("|---|---|---|---|---|---|---|")
    for t, r in sorted(best.items()):
        d = default.get(t)
        setting = (
            f"bm={r['block_m']} bn={r['block_n']} bk={r['block_k']} w={r['num_warps']} s={r['num_stages']}"
        )
        dms = d["ms"] if d else float("nan")
        print(
            f"| {t} | {setting} | {r['ms']:.3f} | {r['bound_ms']:.3f} | {r['of_bound']:.2f} "
            f"| {dms:.3f} | {r['bound_ms'] / dms:.2f} |"
        )
    record = {"args": {a: str(v) for a, v in vars(args).items()}, "rows": rows, "parts": parts}
    (args.out / "fused_moe.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
