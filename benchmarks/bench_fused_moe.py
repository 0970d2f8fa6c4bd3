"""The fused MoE layer (radixserve/runtime/fused_moe.py) against its weight-read time, per tile choice.

For a model shape's expert sizes (default qwen3-30b-a3b: 128 experts of 768, 8 per token,
hidden 2048) and decode-sized token counts, times one layer's `fused_moe` (CUDA events, the
median of `--iters` after a warm-up, routing drawn uniformly) for each tile setting, and the
bound: the bytes of the experts the step touches over the HBM bandwidth (`--tb-s`, 4.8 for an
H200). Prints a table (best setting per token count last) and writes JSON.

    python benchmarks/bench_fused_moe.py --out "$OUT"            # on the GPU machine
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixserve.runtime.fused_moe import Tiles, fused_moe  # noqa: E402
from radixserve.runtime.kernels import TORCH_KERNELS  # noqa: E402


def time_ms(fn, iters: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--tokens", default="64,256")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--tb-s", type=float, default=4.8)
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
        for bm, bn, bk, warps, stages in itertools.product((16, 32, 64), (64, 128), (64, 128), (4, 8), (3, 4))
    ]
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
        top_idx = torch.rand(t, e, device=dev).topk(k, dim=-1).indices
        top_w = torch.full((t, k), 1.0 / k, device=dev, dtype=torch.bfloat16)
        touched = int(torch.unique(top_idx).numel())
        bound_ms = touched * expert_bytes / (args.tb_s * 1e12) * 1e3
        for bm, tiles in settings:
            try:
                ms = time_ms(
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
        if (r["block_n"], r["block_k"], r["num_warps"], r["num_stages"]) == (64, 64, 4, 3)
    }
    print("| tokens | setting | ms | bound ms | of bound | default tiles ms |")
    print("|---|---|---|---|---|---|")
    for t, r in sorted(best.items()):
        d = min((x["ms"] for x in default.values() if x["tokens"] == t), default=float("nan"))
        setting = (
            f"bm={r['block_m']} bn={r['block_n']} bk={r['block_k']} w={r['num_warps']} s={r['num_stages']}"
        )
        print(f"| {t} | {setting} | {r['ms']:.3f} | {r['bound_ms']:.3f} | {r['of_bound']:.2f} | {d:.3f} |")
    (args.out / "fused_moe.json").write_text(
        json.dumps({"args": {k2: str(v) for k2, v in vars(args).items()}, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
