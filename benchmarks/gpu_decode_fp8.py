"""Decode attention over an FP8 pool on the GPU: which tiling reads its K/V fastest?

    source scripts/gpu_env.sh && python3 benchmarks/gpu_decode_fp8.py [--batch 256] [--ctx 1500]

W1L 1000/1000's steady decode (llama-3.1-8b, 256 requests of ~1,500 tokens) spends most of
its step in the split-K decode kernel, and over an FP8 pool that kernel read K/V at 1.85 TB/s
where over a bf16 pool it read 2.86 (H100, `profile_decode.py`): half the bytes, 0.78x the
time. For each model's head layout this times one layer's decode attention (inside a CUDA
graph over 8 layers, as `gpu_decode_attention.py` does) over a bf16 pool with the engine's
tiling, then over an FP8 pool (per-layer scales, as `cache/kv_quant.py` writes them) for
every tiling swept: keys per tile, warps, Triton's pipelining stages, and the tiles' upcast
(q's dtype, or float16 with `fp8_f16`). Each variant is first checked against a float32
reference over the dequantized pool. Prints a table (ms per call, the KV read rate in the
pool's own bytes, error) and writes $OUT/decode_fp8.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import provenance  # noqa: E402
from benchmarks.gpu_attention_check import LLAMA_8B, QWEN_05B, Shape  # noqa: E402
from benchmarks.gpu_decode_attention import LAYERS, decode_reference, measure, print_failed  # noqa: E402
from radixserve.cache.kv_quant import FP8_KV_DTYPE, FP8_MAX, quantize  # noqa: E402
from radixserve.runtime.attention import triton_kernels as tk  # noqa: E402
from radixserve.runtime.attention.base import LayerOptions  # noqa: E402
from radixserve.runtime.attention.triton_decode import decode_tiling  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
SWEEP = {"block_n": (64, 128, 256), "num_warps": (4, 8), "num_stages": (0, 4), "fp8_f16": (False, True)}


class Pool:
    """LAYERS layers of K/V for a batch of `lens` contexts in scattered token slots, in bf16
    and quantized to FP8 with one scale per layer and K/V (absmax / 448)."""

    def __init__(self, shape: Shape, lens: list[int], gen: torch.Generator) -> None:
        slots = sum(lens) + 64
        size = (slots, shape.num_kv_heads, shape.head_dim)
        self.scales: list[tuple[float, float]] = []
        self.fp8: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.bf16: list[tuple[torch.Tensor, torch.Tensor]] = []
        for _ in range(LAYERS):  # float32 one layer at a time: the 8B pool is ~12 GB in bf16
            k, v = torch.randn(size, device="cuda"), torch.randn(size, device="cuda")
            ks, vs = float(k.abs().max()) / FP8_MAX, float(v.abs().max()) / FP8_MAX
            self.scales.append((ks, vs))
            self.fp8.append((quantize(k, ks), quantize(v, vs)))
            self.bf16.append((k.bfloat16(), v.bfloat16()))
        assert self.fp8[0][0].dtype == FP8_KV_DTYPE
        perm = torch.randperm(slots, generator=gen)[: sum(lens)].to(torch.int32).cuda()
        indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        self.table = (indptr.cuda(), perm)
        self.q = torch.randn(len(lens), shape.num_heads, shape.head_dim, dtype=torch.bfloat16, device="cuda")
        self.shape, self.lens = shape, lens

    def reference(self) -> torch.Tensor:
        """Layer 0 in float32 over the dequantized FP8 pool."""
        (k8, v8), (ks, vs) = self.fp8[0], self.scales[0]
        indptr, slots = self.table[0].tolist(), self.table[1].long()
        rows = [slots[indptr[b] : indptr[b + 1]] for b in range(len(self.lens))]
        return decode_reference(self.q, k8.float() * ks, v8.float() * vs, rows)

    def call(self, tiling: tk.DecodeTiling, fp8: bool) -> Callable[[int], torch.Tensor]:
        pools = self.fp8 if fp8 else self.bf16
        opts = [LayerOptions(kv_scales=s if fp8 else None) for s in self.scales]
        scale = self.shape.head_dim**-0.5
        return lambda i: tk.decode_attention(self.q, pools[i], self.table, scale, tiling, opts=opts[i])


def run_case(shape: Shape, batch: int, ctx: int, gen: torch.Generator) -> list[dict[str, Any]]:
    lens = [ctx] * batch
    pool = Pool(shape, lens, gen)
    ref = pool.reference()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    engine = decode_tiling(batch, shape.num_kv_heads, sms)
    variants: list[tuple[str, tk.DecodeTiling, bool]] = [
        ("bf16 engine", engine, False),
        ("fp8 engine, bf16 tiles", replace(engine, fp8_f16=False), True),
        ("fp8 engine, f16 tiles", replace(engine, fp8_f16=True), True),
    ]
    for values in itertools.product(*SWEEP.values()):
        fields = dict(zip(SWEEP, values, strict=True))
        f16 = " f16" if fields["fp8_f16"] else ""
        label = "fp8 {block_n}/{num_warps}/{num_stages}".format(**fields) + f16
        variants.append((label, tk.DecodeTiling(splits=engine.splits, **fields), True))  # type: ignore[arg-type]
    rows = []
    for name, tiling, fp8 in variants:
        kv_bytes = sum(lens) * shape.num_kv_heads * shape.head_dim * 2 * (1 if fp8 else 2)
        row: dict[str, Any] = {"shape": shape.name, "batch": batch, "ctx": ctx, "kernel": name}
        row["tiling"] = str(tiling)
        rows.append(measure(row, pool.call(tiling, fp8), ref, kv_bytes))
    return rows


def print_summary(rows: list[dict[str, Any]]) -> None:
    """Per case: bf16 and FP8 at the engine's tiling (FP8 with either upcast), then the five
    fastest FP8 tilings swept (a label: keys per tile / warps / stages, "f16": float16 tiles)."""
    print(f"\n{'case':<28} {'kernel':<22} {'ms':>8} {'TB/s':>6} {'rel err':>8}")
    for case in sorted({(r["shape"], r["batch"], r["ctx"]) for r in rows}, key=str):
        mine = [r for r in rows if (r["shape"], r["batch"], r["ctx"]) == case and "ms" in r]
        fixed = [r for r in mine if "engine" in r["kernel"]]
        swept = sorted((r for r in mine if "engine" not in r["kernel"]), key=lambda r: r["ms"])
        for r in fixed + swept[:5]:
            label = f"{case[0]} b{case[1]} ctx{case[2]}"
            print(f"{label:<28} {r['kernel']:<22} {r['ms']:>8.4f} {r['kv_tb_s']:>6.2f} {r['rel_err']:>8.1e}")
    print_failed(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[256])
    ap.add_argument("--ctx", type=int, default=1500)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    report: dict[str, Any] = {"workload": "decode_fp8", "provenance": provenance(), "rows": []}
    try:
        for shape in (LLAMA_8B, QWEN_05B):
            for batch in args.batch:
                report["rows"].extend(run_case(shape, batch, args.ctx, gen))
    finally:
        (OUT / "decode_fp8.json").write_text(json.dumps(report, indent=2))
    print_summary(report["rows"])


if __name__ == "__main__":
    main()
