"""A batch-invariant matrix product in Triton, for `EngineConfig(deterministic=True)` on CUDA.

cuBLAS chooses its kernel by shape and may split the K reduction across blocks
(split-K) when M is small, so a row's sum order depends on how many rows came
with it. Here every launch is the same compiled kernel: one tile config, no
autotuning, no split-K, and M left unspecialised (Triton would otherwise compile
M == 1 apart). Row i's output is reduced over K by one program, in BLOCK_K steps
from 0, with the same MMA shape whatever M is, so it depends on row i alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64
NUM_WARPS, NUM_STAGES = 4, 3


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    X,
    W,
    Bias,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: rows [pid_m * BLOCK_M, +BLOCK_M) x columns [pid_n * BLOCK_N, +BLOCK_N)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + offs_k) < K
        x = tl.load(
            X + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            W + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None],
            mask=n_mask[None, :] & k_mask[:, None],
            other=0.0,
        )
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Y + offs_m[:, None] * stride_ym + offs_n[None, :],
        acc.to(Y.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


def triton_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight^T + bias` (float32 accumulation), batch-invariant per row."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k).contiguous()
    w = weight.contiguous()
    m, n = rows.shape[0], w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        _linear_kernel[grid](
            rows,
            w,
            bias if bias is not None else w,  # unread without HAS_BIAS
            y,
            m,
            n,
            k,
            rows.stride(0),
            w.stride(0),
            y.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            # float32 models: full-precision products (TF32 would differ from torch's default).
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
        )
    return y.view(*lead, n)
