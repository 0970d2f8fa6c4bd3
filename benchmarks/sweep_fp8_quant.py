"""The FP8 token quantizer's launch shape (columns per pass, warps per token) by token count, on one GPU.

For the SiLU·mul form over a `[tokens, 2 * I]` gate/up output (I = 14336, llama-3.1-8b's down
projection) and the plain form over `[tokens, K]` rows (K = 4096, its o_proj input), times
`fp8_quant`'s kernel at each (block, warps) of `--shapes`, as a ratio to the engine's current shape
(`fp8_quant.launch_shape`), and for the SiLU·mul form the two launches it replaces
(FlashInfer's SiLU·mul, the engine's layer kernel, then the plain quantizer). Every shape's bytes and
scales must equal the current shape's (a row's reduction order may not change them); a shape that
differs is reported as such. Median of graph replays (benchmarks/gpu_timing.py).

    python benchmarks/sweep_fp8_quant.py --out "$OUT"          # on the GPU machine
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import provenance  # noqa: E402
from benchmarks.gpu_timing import graph_ms  # noqa: E402
from radixserve.runtime import fp8_quant  # noqa: E402
from radixserve.runtime.kernels import make_kernels  # noqa: E402

SHAPES = "2048/4,2048/8,2048/16,4096/8,4096/16,1024/4,1024/8"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """ "2048/4,4096/16" -> [(2048, 4), (4096, 16)]: (columns per pass, warps per token)."""
    return [(int(b), int(w)) for b, w in (part.split("/") for part in text.split(","))]


def sweep_row(silu_mul: bool, k: int, m: int, shapes: list[tuple[int, int]], iters: int) -> dict:
    """Milliseconds of each launch shape (None where its bytes differ from the current shape's)."""
    x = torch.randn(m, 2 * k if silu_mul else k, device="cuda", dtype=torch.bfloat16) * 2
    current = fp8_quant.launch_shape(k, silu_mul)
    ref_values, ref_scales = fp8_quant.token_quant(x, k, silu_mul, current)
    row: dict = {
        "form": "silu_mul" if silu_mul else "plain",
        "k": k,
        "tokens": m,
        "current": f"{current[0]}/{current[1]}",
    }
    if silu_mul:
        act = make_kernels("auto", x.device, x.dtype).silu_and_mul
        row["two_launches"] = graph_ms(lambda: fp8_quant.quantize_tokens(act(x)), iters)
    for block, warps in shapes:
        values, scales = fp8_quant.token_quant(x, k, silu_mul, (block, warps))
        same = torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))
        timed = functools.partial(fp8_quant.token_quant, x, k, silu_mul, (block, warps))
        row[f"{block}/{warps}"] = graph_ms(timed, iters) if same and torch.equal(scales, ref_scales) else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="BLOCK/WARPS,... launch shapes to time")
    ap.add_argument("--tokens", default="16,64,128,256,512,1024,2048")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    rows = [
        sweep_row(silu_mul, k, m, shapes, args.iters)
        for silu_mul, k in ((True, 14336), (False, 4096))
        for m in (int(t) for t in args.tokens.split(","))
    ]
    labels = [f"{b}/{w}" for b, w in shapes]
    print("ms, and / the current shape: | form | tokens | two launches | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 3) + "|")
    for r in rows:
        base = r[r["current"]] if r.get(r["current"]) is not None else float("nan")
        cells = [
            "bytes differ" if r[c] is None else f"{r[c]:.4f} ({r[c] / base:.2f})"
            for c in ["two_launches", *labels]
            if c in r
        ]
        two = "" if "two_launches" in r else "- | "
        print(f"| {r['form']} | {r['tokens']} | {two}" + " | ".join(cells) + " |")
    record = {
        **provenance(),
        "device": torch.cuda.get_device_name(),
        "args": vars(args) | {"out": str(args.out)},
    }
    (args.out / "fp8_quant_sweep.json").write_text(json.dumps(record | {"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
