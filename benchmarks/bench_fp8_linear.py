"""FP8 linears against bf16 on one GPU, per projection of a model's layer and token count.

For each linear of a decoder layer (default llama-3.1-8b: qkv 4096->6144, o 4096->4096,
gate_up 4096->28672, down 14336->4096) and each token count (decode 64, 256; prefill 2048,
8192), times the bf16 `F.linear`, the FP8 linear with its input quantized by torch ops
(`fp8_linear.quantize_rows`, the path before runtime/fp8_quant.py) and by the one-launch Triton
quantizer (`fp8_quant.quantize_tokens`, the engine's path), and each quantizer and the scaled
GEMM alone. Every figure is the median of graph replays (benchmarks/gpu_timing.py), as a
decode step runs; prefill steps run eagerly, so their launch gaps are not in these figures.
The layer table sums a layer's four linears: what FP8 saves or costs per layer. The last one
times the down projection's input: SiLU·mul (the engine's layer kernel, FlashInfer's) then the
quantizer, against `fp8_quant.silu_mul_quantize_tokens` (both in one launch; the engine's path);
the norm table the FP8 input of qkv and gate/up: the residual add + RMSNorm (FlashInfer's, the
engine's layer kernel) then the quantizer, against `fp8_quant.add_rms_norm_quantize_tokens`.

    python benchmarks/bench_fp8_linear.py --out "$OUT"          # on the GPU machine
    python benchmarks/bench_fp8_linear.py --tokens 128,4096 --shapes 4096x6144,14336x4096
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import provenance  # noqa: E402
from benchmarks.gpu_timing import graph_ms  # noqa: E402
from radixserve.runtime.fp8_linear import quantize_rows, quantize_weight, scaled_mm_linear  # noqa: E402
from radixserve.runtime.fp8_quant import (  # noqa: E402
    add_rms_norm_quantize_tokens,
    quantize_tokens,
    silu_mul_quantize_tokens,
)
from radixserve.runtime.kernels import make_kernels  # noqa: E402

# llama-3.1-8b's linears as (in K, out N), by name.
LLAMA_8B = "qkv_proj=4096x6144,o_proj=4096x4096,gate_up_proj=4096x28672,down_proj=14336x4096"
COLUMNS = ("bf16", "fp8_torch_quant", "fp8_triton_quant", "quant_torch", "quant_triton", "scaled_mm")


def parse_shapes(text: str) -> dict[str, tuple[int, int]]:
    """ "qkv=4096x6144,down=14336x4096" (names optional) -> {"qkv": (4096, 6144), ...}."""
    shapes = {}
    for part in filter(None, text.split(",")):
        name, _, dims = part.rpartition("=")
        k, _, n = dims.partition("x")
        shapes[name or dims] = (int(k), int(n))
    return shapes


def time_linear(k: int, n: int, m: int, iters: int) -> dict[str, float]:
    """Milliseconds of each way of computing `[m, k] @ [n, k]^T` in bf16 / FP8 (see the doc)."""
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16) * 3
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    wq, ws = quantize_weight(w)
    xq, xs = quantize_tokens(x)
    calls = {
        "bf16": lambda: F.linear(x, w),
        "fp8_torch_quant": lambda: scaled_mm_linear(x, wq, ws, None, quantize_rows),
        "fp8_triton_quant": lambda: scaled_mm_linear(x, wq, ws, None, quantize_tokens),
        "quant_torch": lambda: quantize_rows(x),
        "quant_triton": lambda: quantize_tokens(x),
        "scaled_mm": lambda: torch._scaled_mm(
            xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16
        ),
    }
    return {name: graph_ms(fn, iters) for name, fn in calls.items()}


def time_silu_quant(i: int, m: int, iters: int) -> dict[str, float]:
    """Milliseconds of the down projection's FP8 input from a `[m, 2i]` gate/up: two kernels or one."""
    gate_up = torch.randn(m, 2 * i, device="cuda", dtype=torch.bfloat16) * 2
    act = make_kernels("auto", gate_up.device, gate_up.dtype).silu_and_mul  # the engine's (FlashInfer's)
    return {
        "two_launches": graph_ms(lambda: quantize_tokens(act(gate_up)), iters),
        "fused": graph_ms(lambda: silu_mul_quantize_tokens(gate_up), iters),
    }


def time_norm_quant(hidden: int, m: int, iters: int) -> dict[str, float]:
    """Milliseconds of a projection's FP8 input from the residual add + RMSNorm: two kernels or one
    (both update the residual in place, as the engine's do)."""
    x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    kernels = make_kernels("auto", x.device, x.dtype)  # the engine's (FlashInfer's)
    normed = x.clone()
    return {
        "two_launches": graph_ms(
            lambda: quantize_tokens(kernels.add_rms_norm(normed, residual, weight, 1e-5)[0]), iters
        ),
        "fused": graph_ms(lambda: add_rms_norm_quantize_tokens(x, residual, weight, 1e-5, False), iters),
    }


def print_fused(columns: str, rows: list[dict]) -> None:
    """A table of two launches against the fused kernel per token count."""
    print(f"| tokens | {columns} |")
    print("|---|---|---|---|")
    for r in rows:
        two, one = r["two_launches"], r["fused"]
        print(f"| {r['tokens']} | {two:.4f} | {one:.4f} | {one / two:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=LLAMA_8B, help="NAME=KxN,... (the linears of one layer)")
    ap.add_argument("--tokens", default="64,256,2048,8192")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    shapes, tokens = parse_shapes(args.shapes), [int(t) for t in args.tokens.split(",")]
    rows = [
        {"linear": name, "k": k, "n": n, "tokens": m, **time_linear(k, n, m, args.iters)}
        for m in tokens
        for name, (k, n) in shapes.items()
    ]
    print("| linear | tokens | " + " | ".join(f"{c} ms" for c in COLUMNS) + " | fp8 (triton) / bf16 |")
    print("|" + "---|" * (len(COLUMNS) + 3))
    for r in rows:
        cells = " | ".join(f"{r[c]:.4f}" for c in COLUMNS)
        print(f"| {r['linear']} | {r['tokens']} | {cells} | {r['fp8_triton_quant'] / r['bf16']:.2f} |")
    print("| tokens | layer bf16 ms | layer fp8 torch-quant ms | layer fp8 triton-quant ms | fp8 / bf16 |")
    print("|---|---|---|---|---|")
    layers = {}
    for m in tokens:
        sums = {c: sum(r[c] for r in rows if r["tokens"] == m) for c in COLUMNS}
        layers[m] = sums
        print(
            f"| {m} | {sums['bf16']:.4f} | {sums['fp8_torch_quant']:.4f} | {sums['fp8_triton_quant']:.4f} "
            f"| {sums['fp8_triton_quant'] / sums['bf16']:.2f} |"
        )
    down_k = shapes.get("down_proj", (14336, 4096))[0]
    silu = [{"i": down_k, "tokens": m, **time_silu_quant(down_k, m, args.iters)} for m in tokens]
    print_fused(f"SiLU·mul then quantize ms | fused ms | fused / two (I = {down_k})", silu)
    hidden = shapes.get("qkv_proj", (4096, 6144))[0]
    norm = [{"hidden": hidden, "tokens": m, **time_norm_quant(hidden, m, args.iters)} for m in tokens]
    print_fused(f"add + RMSNorm then quantize ms | fused ms | fused / two (hidden {hidden})", norm)
    record = {
        **provenance(),
        "device": torch.cuda.get_device_name(),
        "args": vars(args) | {"out": str(args.out)},
        "rows": rows,
        "layer_sums": layers,
        "silu_quant": silu,
        "norm_quant": norm,
    }
    (args.out / "fp8_linear.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
