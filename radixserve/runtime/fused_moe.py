"""Mixture-of-experts feed-forward on the GPU: two grouped GEMMs over tokens sorted by expert.

Each token picked `k` experts, so a step has `P = T * k` (token, expert) pairs. `align`
(runtime/moe_align.py: one kernel, three for a prefill step) sorts the pairs by expert
and pads each expert's run to a multiple of `BLOCK_M`, so that every block of `BLOCK_M`
sorted pairs belongs to one expert; `grouped_gemm` then runs one program per (block,
column tile), which reads that expert's weight tile once for all the block's pairs. The
first GEMM reads the tokens' hidden states (`pair // k`) through `gate_up_proj [E, 2I,
H]`, the activation-and-mul is the model's own kernel, and the second GEMM reads each
pair's row through `down_proj [E, H, I]` and scales it by the pair's routing weight; the
`k` rows of a token are then summed.

Nothing here waits on the device: the padded layout's size has a bound the host
knows (`P + E * (BLOCK_M - 1)`), the grid covers that bound and programs past
the real end (read on the device) return at once. So a decode step replays it
from a CUDA graph. Importing this module imports triton (CUDA, or the CPU
interpreter with TRITON_INTERPRET=1, as the tests run it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixserve.runtime.moe_align import Alignment, align


@triton.jit
def _grouped_gemm_kernel(
    A,
    B,
    C,
    SortedPairs,
    BlockExpert,
    PaddedTotal,
    Weights,
    num_pairs,
    N,
    K,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    TOP_K: tl.constexpr,
    A_BY_TOKEN: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """C[pair, :] = A[row(pair), :] @ B[expert]^T (times the pair's weight with SCALE)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(PaddedTotal):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(SortedPairs + offs_m)
    real = pair < num_pairs
    row = pair // TOP_K if A_BY_TOKEN else pair
    expert = tl.load(BlockExpert + pid_m)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + row[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=real[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SCALE:
        acc = acc * tl.load(Weights + pair, mask=real, other=0.0)[:, None]
    c_ptrs = C + pair[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=real[:, None] & (offs_n[None, :] < N))


@dataclass(frozen=True)
class Tiles:
    """A grouped GEMM's column and depth tiles and its launch shape (rows: `Alignment.block_m`)."""

    # 128 x 128 tiles: the best of benchmarks/bench_fused_moe.py's sweep at 64 and 256
    # tokens (qwen3-30b-a3b's experts, H100, graph-replayed), 3-6% over 64 x 64.
    block_n: int = 128
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3

    def fit(self, n: int, k: int) -> Tiles:
        """These tiles, narrowed for a small matrix (tl.dot needs at least 16)."""
        return Tiles(
            min(self.block_n, max(16, triton.next_power_of_2(n))),
            min(self.block_k, max(16, triton.next_power_of_2(k))),
            self.num_warps,
            self.num_stages,
        )


def grouped_gemm(
    a: torch.Tensor,
    weight: torch.Tensor,
    al: Alignment,
    top_k: int,
    a_by_token: bool,
    scale: torch.Tensor | None = None,
    tiles: Tiles = Tiles(),
) -> torch.Tensor:
    """`[P, N]`: row p is `a[p // top_k if a_by_token else p] @ weight[expert(p)].T`, times `scale[p]`.

    `a [rows, K]` and `weight [E, N, K]` contiguous in their last dim."""
    _, n, k = weight.shape
    if a.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("grouped_gemm reads rows: a and weight must be contiguous in their last dim")
    out = torch.empty(al.num_pairs, n, dtype=a.dtype, device=a.device)
    t = tiles.fit(n, k)
    grid = (al.sorted_pairs.numel() // al.block_m, triton.cdiv(n, t.block_n))
    _grouped_gemm_kernel[grid](
        a,
        weight,
        out,
        al.sorted_pairs,
        al.block_expert,
        al.padded_total,
        scale if scale is not None else out,  # unread without SCALE
        al.num_pairs,
        n,
        k,
        a.stride(0),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        TOP_K=top_k,
        A_BY_TOKEN=a_by_token,
        SCALE=scale is not None,
        BLOCK_M=al.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )
    return out


# Prefill-sized steps (128-row blocks): 64-deep tiles over 8 warps. The sweep of
# benchmarks/bench_fused_moe.py (qwen3-30b-a3b's experts, H100, 2026-12-06) put them first at
# 2,048 and 8,192 tokens: 0.888 and 2.671 ms per layer against 1.047 and 3.336 ms with
# 64-row blocks and the decode tiles.
PREFILL_TILES = Tiles(block_n=128, block_k=64, num_warps=8, num_stages=3)


def block_m_for(pairs: int, num_experts: int) -> int:
    """Rows per block: about the pairs an expert gets (a block pads to it), at least tl.dot's 16."""
    per_expert = pairs / num_experts
    # Counts scatter around the mean: at 16 per expert, 16-row blocks often take two reads
    # of an expert's weights where one 32-row block takes one (0.477 against 0.504 ms at
    # 256 tokens of qwen3-30b-a3b in the sweep).
    return 16 if per_expert <= 8 else 32 if per_expert <= 24 else 64 if per_expert <= 64 else 128


def tiles_for(block_m: int) -> Tiles:
    """The GEMMs' tiles for blocks of `block_m` rows."""
    return PREFILL_TILES if block_m >= 128 else Tiles()


def fused_moe(
    x: torch.Tensor,
    top_idx: torch.Tensor,
    top_w: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],
    block_m: int | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """`[T, H]`: each token's experts' gated MLPs, weighted by `top_w [T, k]` and summed.
    (`block_m` / `tiles`: the GEMMs' tiles, chosen here unless given: benchmarks sweep them.)"""
    tokens, top_k = top_idx.shape
    if tokens == 0:
        return torch.zeros_like(x)
    num_experts = gate_up_proj.shape[0]
    block_m = block_m or block_m_for(tokens * top_k, num_experts)
    tiles = tiles or tiles_for(block_m)
    al = align(top_idx, num_experts, block_m)
    h = grouped_gemm(x, gate_up_proj, al, top_k, a_by_token=True, tiles=tiles)
    h = act_and_mul(h)
    w = top_w.reshape(-1).to(torch.float32)
    y = grouped_gemm(h, down_proj, al, top_k, a_by_token=False, scale=w, tiles=tiles)
    return y.view(tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
