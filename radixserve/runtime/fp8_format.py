"""The FP8 format of weights and activations, shared by the torch quantizer (fp8_linear.py) and
the Triton one (fp8_quant.py): float8_e4m3fn, saturating at 448, a per-row scale of
absmax / 448 with a floor so that an all-zero row still gets a finite scale.

Both quantizers compute with products, not divisions: scale = absmax * fl(1/448), values =
x * (1 / scale) with the reciprocal taken once per row. A float32 product rounds the same in
torch on the CPU and the GPU and in compiled Triton, a division by a scalar does not (torch's CUDA
kernel multiplies by the reciprocal; Triton's compiled `/`, and `tl.fdiv(ieee_rounding=True)`
with it, are approximate: 308 / 448 came out one ulp above 0.6875 on an H100, 2026-12-07), and an
exact division per element made the Triton quantizer 1.3-2x slower at decode sizes."""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_AMAX = 1e-12
# 1/448 rounded to float32 (exact as a float32 constant in torch and Triton alike).
INV_FP8_MAX = float(torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
# Widest row fp8_quant's fused add + norm + quantizer holds in registers (llama-3.1-405b's 16,384);
# wider norms feeding FP8 linears run the norm kernel and the linear's own quantizer.
NORM_FUSE_MAX_WIDTH = 16384
