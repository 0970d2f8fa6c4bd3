"""The FP8 format of weights and activations, shared by the torch quantizer (fp8_linear.py) and
the Triton one (fp8_quant.py): float8_e4m3fn, saturating at 448, a per-row scale of
absmax / 448 with a floor so that an all-zero row still gets a finite scale."""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_AMAX = 1e-12
