"""Start-up builds of the CUDA FP8 kernels: the linear's input quantizer, its SiLU·mul-fused form
and the residual add + RMSNorm fused with it (runtime/fp8_quant.py).

Triton compiles a kernel on its first launch (a second or two) once per variant, and the variant
follows the row width (the block size is the next power of two, up to a cap), so each build runs
at a width the model's steps quantize: a build at a toy width would compile a variant no step
launches. Built here, each compiles under start()'s progress lines, before CUDA-graph captures.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from radixserve.runtime.fp8_linear import cuda_quantizer, fp8_add_rms_norm
from radixserve.runtime.warm_up import KernelBuild, dtype_name


@dataclass(frozen=True)
class Fp8Use:
    """What a model's FP8 linears quantize on CUDA."""

    dtype: torch.dtype
    device: torch.device
    input_widths: tuple[int, ...]  # in_features of the FP8 linears that quantize their own input
    silu_widths: tuple[int, ...]  # FP8 down projections' in_features after SiLU·mul (the fused one)
    norm_width: int | None  # hidden size of the norms that feed FP8 linears (the fused add + norm)
    plus_one: bool  # those norms scale by (1 + weight) (Gemma)


def kernel_builds(use: Fp8Use) -> list[KernelBuild]:
    name = dtype_name(use.dtype)
    builds = [
        KernelBuild(
            f"triton fp8 {form}input quantizer {name} width {k}", functools.partial(_quantize, use, k, fused)
        )
        for form, fused, widths in (("", False, use.input_widths), ("SiLU·mul ", True, use.silu_widths))
        for k in widths
    ]
    if use.norm_width is not None:
        form = "(1 + w) " if use.plus_one else ""
        label = f"triton fp8 add + {form}RMSNorm quantizer {name} width {use.norm_width}"
        builds.append(KernelBuild(label, functools.partial(_add_norm, use, use.norm_width)))
    return builds


def _quantize(use: Fp8Use, k: int, silu_mul: bool) -> None:
    rows = torch.ones(2, 2 * k if silu_mul else k, dtype=use.dtype, device=use.device)
    cuda_quantizer(silu_mul)(rows)


def _add_norm(use: Fp8Use, k: int) -> None:
    x = torch.ones(2, k, dtype=use.dtype, device=use.device)
    fp8_add_rms_norm(x, x.clone(), torch.ones(k, dtype=use.dtype, device=use.device), 1e-6, use.plus_one)
