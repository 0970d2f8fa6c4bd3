"""Sorting a step's (token, expert) pairs by expert for the grouped GEMMs.

Each token picked `k` experts, so a step has `P = T * k` pairs. The grouped GEMMs
(runtime/fused_moe.py) want them sorted by expert with each expert's run padded to
a multiple of `block_m`, so that every block of `block_m` sorted pairs belongs to
one expert. For a decode step's few pairs one Triton program does it (a dozen torch
kernels did before, each a few microseconds of a decode step, in every MoE layer);
above `PARALLEL_PAIRS` the passes over pairs (2 and 4) run one program per chunk of
pairs, as separate kernels around a one-program pass 3:

1. every slot of the padded layout holds the padding id `P`;
2. an atomic add per pair counts the pairs of its expert and hands the pair its
   rank in that expert's run (ranks come in any order: each pair's output row is
   computed alone, so the order inside a run changes no result);
3. the padded runs' starts, a cumulative sum over the experts;
4. each pair's id stored at its run's start + its rank; each block's expert is
   the number of runs that end at or before the block's first slot.

The layout's size has a bound the host knows (`P + E * (block_m - 1)`, rounded up
to `block_m`); where it really ends is written on the device, so nothing waits on
the device and a decode step replays it from a CUDA graph. The one-program kernel
writes scratch (counts, ranks, starts) and reads it back after a barrier, through
L2 (`.cg`), so an SM's L1 never serves a stale line; between kernels the launch
order does that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_CHUNK = 1024  # pairs per loop iteration (registers: 8 per thread at 4 warps)
_BLOCK_CHUNK = 64  # blocks per iteration of the block-expert loop
PARALLEL_PAIRS = 4 * _CHUNK  # above this, the passes over pairs run in one program per chunk


@dataclass(frozen=True)
class Alignment:
    """The pairs sorted by expert, each expert's run padded to a multiple of `block_m`."""

    sorted_pairs: torch.Tensor  # [bound] int64: pair ids (token * k + slot); `num_pairs` = padding
    block_expert: torch.Tensor  # [bound / block_m] int64: the expert of each block
    padded_total: torch.Tensor  # [1] int64: where the padded layout really ends (on the device)
    block_m: int
    num_pairs: int


@triton.jit
def _count_chunk(TopIdx, Counts, Rank, s, num_pairs, CHUNK: tl.constexpr):
    """Pass 2 over pairs `s .. s + CHUNK`: each counted in its expert, its rank kept."""
    c = s + tl.arange(0, CHUNK)
    m = c < num_pairs
    ex = tl.load(TopIdx + c, mask=m, other=0)
    rank = tl.atomic_add(Counts + ex, 1, mask=m)
    tl.store(Rank + c, rank, mask=m)


@triton.jit
def _run_starts(Counts, Starts, PaddedTotal, num_experts, E_P: tl.constexpr, BLOCK_M: tl.constexpr):
    """Pass 3: each expert's padded run start, and where the layout ends; returns the runs' ends."""
    e = tl.arange(0, E_P)
    is_expert = e < num_experts
    counts = tl.load(Counts + e, mask=is_expert, other=0, cache_modifier=".cg")
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, 0)
    tl.store(Starts + e, end - padded, mask=is_expert)
    tl.store(PaddedTotal, tl.sum(padded, 0).to(tl.int64))
    return tl.where(is_expert, end, 2147483647)  # experts past the last end nowhere


@triton.jit
def _scatter_chunk(TopIdx, Rank, Starts, SortedPairs, s, num_pairs, CHUNK: tl.constexpr):
    """Pass 4 over pairs `s .. s + CHUNK`: each pair's id at its run's start + its rank."""
    c = s + tl.arange(0, CHUNK)
    m = c < num_pairs
    ex = tl.load(TopIdx + c, mask=m, other=0)
    rank = tl.load(Rank + c, mask=m, other=0, cache_modifier=".cg")
    start = tl.load(Starts + ex, mask=m, other=0, cache_modifier=".cg")
    tl.store(SortedPairs + start + rank, c.to(tl.int64), mask=m)


@triton.jit
def _block_experts(ends, BlockExpert, num_experts, bound, BLOCK_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr):
    """Pass 4's other half: a block's expert is the number of runs ending at or before it."""
    b = tl.arange(0, BLOCK_CHUNK)
    for s in range(0, bound // BLOCK_M, BLOCK_CHUNK):
        first = (s + b) * BLOCK_M
        before = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        expert = tl.minimum(before, num_experts - 1)
        tl.store(BlockExpert + s + b, expert.to(tl.int64), mask=first < bound)


@triton.jit
def _align_kernel(
    TopIdx,
    Counts,
    Rank,
    Starts,
    SortedPairs,
    BlockExpert,
    PaddedTotal,
    num_pairs,
    num_experts,
    bound,
    E_P: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """All four passes in one program (a decode step's few pairs)."""
    e = tl.arange(0, E_P)
    c = tl.arange(0, CHUNK)
    tl.store(Counts + e, tl.zeros([E_P], dtype=tl.int32), mask=e < num_experts)
    for s in range(0, bound, CHUNK):
        tl.store(SortedPairs + s + c, tl.zeros([CHUNK], dtype=tl.int64) + num_pairs, mask=s + c < bound)
    tl.debug_barrier()
    for s in range(0, num_pairs, CHUNK):
        _count_chunk(TopIdx, Counts, Rank, s, num_pairs, CHUNK)
    tl.debug_barrier()
    ends = _run_starts(Counts, Starts, PaddedTotal, num_experts, E_P, BLOCK_M)
    tl.debug_barrier()
    for s in range(0, num_pairs, CHUNK):
        _scatter_chunk(TopIdx, Rank, Starts, SortedPairs, s, num_pairs, CHUNK)
    _block_experts(ends, BlockExpert, num_experts, bound, BLOCK_CHUNK, BLOCK_M)


# Above `PARALLEL_PAIRS` pairs (a prefill step's) the passes over pairs spread over one
# program per chunk, as three kernels: one program going round a chunk at a time took 0.50
# of an 8,192-token layer's 2.67 ms on an H100 (65,536 pairs).


@triton.jit
def _count_kernel(TopIdx, Counts, Rank, num_pairs, CHUNK: tl.constexpr):
    _count_chunk(TopIdx, Counts, Rank, tl.program_id(0) * CHUNK, num_pairs, CHUNK)


@triton.jit
def _layout_kernel(
    Counts,
    Starts,
    BlockExpert,
    PaddedTotal,
    num_experts,
    bound,
    E_P: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    ends = _run_starts(Counts, Starts, PaddedTotal, num_experts, E_P, BLOCK_M)
    _block_experts(ends, BlockExpert, num_experts, bound, BLOCK_CHUNK, BLOCK_M)


@triton.jit
def _scatter_kernel(TopIdx, Rank, Starts, SortedPairs, num_pairs, CHUNK: tl.constexpr):
    _scatter_chunk(TopIdx, Rank, Starts, SortedPairs, tl.program_id(0) * CHUNK, num_pairs, CHUNK)


def align(top_idx: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort `top_idx [T, k]`'s pairs by expert, each expert's run padded to `block_m`."""
    flat = top_idx.reshape(-1)
    pairs = flat.numel()
    device = flat.device
    bound = pairs + num_experts * (block_m - 1)
    bound = (bound + block_m - 1) // block_m * block_m
    rank = torch.empty(max(pairs, 1), dtype=torch.int32, device=device)
    starts = torch.empty(num_experts, dtype=torch.int32, device=device)
    block_expert = torch.empty(bound // block_m, dtype=torch.int64, device=device)
    padded_total = torch.empty(1, dtype=torch.int64, device=device)
    e_p = triton.next_power_of_2(num_experts)
    if pairs <= PARALLEL_PAIRS:
        counts = torch.empty(num_experts, dtype=torch.int32, device=device)
        sorted_pairs = torch.empty(bound, dtype=torch.int64, device=device)
        _align_kernel[(1,)](
            flat,
            counts,
            rank,
            starts,
            sorted_pairs,
            block_expert,
            padded_total,
            pairs,
            num_experts,
            bound,
            E_P=e_p,
            CHUNK=_CHUNK,
            BLOCK_CHUNK=_BLOCK_CHUNK,
            BLOCK_M=block_m,
            num_warps=4,
        )
    else:
        counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
        sorted_pairs = torch.full((bound,), pairs, dtype=torch.int64, device=device)
        grid = (triton.cdiv(pairs, _CHUNK),)
        _count_kernel[grid](flat, counts, rank, pairs, CHUNK=_CHUNK, num_warps=4)
        _layout_kernel[(1,)](
            counts,
            starts,
            block_expert,
            padded_total,
            num_experts,
            bound,
            E_P=e_p,
            BLOCK_CHUNK=_BLOCK_CHUNK,
            BLOCK_M=block_m,
            num_warps=4,
        )
        _scatter_kernel[grid](flat, rank, starts, sorted_pairs, pairs, CHUNK=_CHUNK, num_warps=4)
    return Alignment(sorted_pairs, block_expert, padded_total, block_m, pairs)
