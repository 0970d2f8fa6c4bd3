"""Shared-prefix (cascade) decode attention in Triton: the prefix read once per group.

A cascade step (runtime/cascade.py) has two levels. Here both write partial
results into one buffer of partials per (row, query head), and the decode
kernel's reduction merges them all by their log-sum-exp, which is exact:

- level 1, every row over its own suffix: the decode split kernel, its
  `s1` splits in partials `0..s1-1` (partial 0 always holds the token being
  decoded, so the merge's maximum is finite);
- level 0, each group's queries over its shared prefix: `_prefix_split_kernel`,
  one program per (group, KV head, block of the group's query rows, split of
  the prefix), whose query tile is every grouped row's GQA heads of that KV
  head. So each prefix K/V tile is loaded once for up to BLOCK_M query rows
  (FlashInfer's level 0 is a prefill over few CTAs; this one splits the
  prefix, so a lone group of 16-64 rows still fills the GPU). Its `s0`
  splits go to partials `s1..s1+s0-1`; ungrouped rows keep -inf there.

Plans are host arithmetic plus `cascade_indices`' few device ops; the step runs
eagerly (launch shapes follow the groups). Used by the Triton backend and by
the FlashInfer backend's Triton decode; checked against the torch reference
under the interpreter on the CPU (tests/runtime/test_backends.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from radixserve.runtime.attention import triton_kernels as tk
from radixserve.runtime.attention.triton_decode import decode_tiling
from radixserve.runtime.attention.triton_softmax import LOG2E, attend_tile, normalized
from radixserve.runtime.cascade import CascadeGroups, cascade_indices
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.host import to_device

_WAVES = 4  # programs per SM to aim for
_MAX_PREFIX_SPLITS = 32
_MIN_KEYS_PER_SPLIT = 128


@triton.jit
def _prefix_split_kernel(
    Q,
    K,
    V,
    group_rows,
    group_indptr,
    prefix_indptr,
    prefix_indices,
    Mid_O,
    Mid_LSE,
    sm_scale_log2,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MID_SPLITS: tl.constexpr,
    MID_BASE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    g = tl.program_id(0)
    num_kv_heads = NUM_HEADS // GROUP
    hk = tl.program_id(1) % num_kv_heads
    mb = tl.program_id(1) // num_kv_heads
    s = tl.program_id(2)
    r0 = tl.load(group_indptr + g)
    n_rows = (tl.load(group_indptr + g + 1) - r0) * GROUP
    # Tile row m is query head hk*GROUP + m % GROUP of the group's row m // GROUP.
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < n_rows
    rows = tl.load(group_rows + r0 + offs_m // GROUP, mask=m_mask, other=0).to(tl.int64)
    heads = hk * GROUP + offs_m % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    p_start = tl.load(prefix_indptr + g)
    p_len = tl.load(prefix_indptr + g + 1) - p_start
    split_len = tl.cdiv(p_len, NUM_SPLITS)
    lo = s * split_len
    # A block past the group's rows does no work (the grid covers the largest group).
    hi = tl.where(mb * BLOCK_M < n_rows, tl.minimum(lo + split_len, p_len), lo)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        slots = tl.load(prefix_indices + p_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(
            q,
            K + hk * stride_kh,
            V + hk * stride_vh,
            slots,
            n_mask,
            n_mask[None, :],
            stride_kn,
            stride_vn,
            offs_d,
            d_mask,
            sm_scale_log2,
            m_i,
            l_i,
            acc,
            DOT_PRECISION,
        )

    out, lse = normalized(acc, l_i, m_i)
    part = (rows * NUM_HEADS + heads) * MID_SPLITS + MID_BASE + s
    tl.store(Mid_O + part[:, None] * BLOCK_D + offs_d[None, :], out, mask=m_mask[:, None] & d_mask[None, :])
    tl.store(Mid_LSE + part, lse, mask=m_mask)


@dataclass(frozen=True)
class CascadeShape:
    """What a backend knows once, at start: its heads, scale, key tile and the GPU's SM count."""

    num_kv_heads: int
    group: int  # query heads per KV head
    scale: float
    block_n: int
    num_sms: int


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass
class TritonCascadePlan:
    """One cascade step's two levels as device arrays, and its launch shape; `run` per layer."""

    scale: float
    suffix_indptr: torch.Tensor  # [B + 1] int32
    suffix_indices: torch.Tensor  # [sum of suffixes] int32
    suffix_tiling: tk.DecodeTiling
    group_rows: torch.Tensor  # [grouped rows] int32, group after group
    group_indptr: torch.Tensor  # [G + 1] int32 into group_rows
    prefix_indptr: torch.Tensor  # [G + 1] int32 into prefix_indices
    prefix_indices: torch.Tensor  # [sum of prefixes] int32
    num_groups: int
    row_blocks: int  # query-row blocks of the largest group
    block_m: int
    prefix_splits: int
    block_n: int
    num_warps: int
    # Partials [B, Hq, s1 + s0, D] and [B, Hq, s1 + s0], made by the first layer and reused by the
    # next (layers run one after the other on one stream): what a layer writes, it overwrites;
    # what no layer writes (level 0 of rows outside groups) stays -inf from the first fill.
    mid: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def build(batch: ForwardBatch, groups: CascadeGroups, shape: CascadeShape) -> TritonCascadePlan:
        idx = cascade_indices(batch.kv_indices, batch.seq_lens, groups)
        device = batch.kv_indices.device
        sizes = idx.group_sizes
        block_m = min(64, max(16, triton.next_power_of_2(max(sizes) * shape.group)))
        row_blocks = -(-max(sizes) * shape.group // block_m)
        programs = len(sizes) * shape.num_kv_heads * row_blocks
        want = _WAVES * shape.num_sms // max(1, programs)
        longest = max(idx.prefix_lens) // _MIN_KEYS_PER_SPLIT
        b = batch.batch_size
        tiling = decode_tiling(b, shape.num_kv_heads, shape.num_sms, max(idx.suffix_lens))
        return TritonCascadePlan(
            scale=shape.scale,
            suffix_indptr=to_device([0, *itertools.accumulate(idx.suffix_lens)], torch.int32, device),
            suffix_indices=idx.suffix_indices,
            suffix_tiling=replace(tiling, block_n=shape.block_n),
            group_rows=to_device(groups.grouped_rows, torch.int32, device),
            group_indptr=to_device([0, *itertools.accumulate(sizes)], torch.int32, device),
            prefix_indptr=to_device([0, *itertools.accumulate(idx.prefix_lens)], torch.int32, device),
            prefix_indices=idx.prefix_indices,
            num_groups=len(sizes),
            row_blocks=row_blocks,
            block_m=block_m,
            prefix_splits=_pow2_floor(min(want, _MAX_PREFIX_SPLITS, max(1, longest))),
            block_n=shape.block_n,
            num_warps=4,
        )

    def run(self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """q `[B, Hq, D]` over the layer's `(k, v)` buffers `[S, Hkv, D]` (or their
        page-size-1 views `[S, 1, Hkv, D]`) -> `[B, Hq, D]`."""
        k, v = tk.token_rows(cache)
        q = tk.check_qkv(q, k, v)
        s1, s0 = self.suffix_tiling.splits, self.prefix_splits
        if self.mid is None:
            self.mid = tk.new_partials(q, s1 + s0)
            self.mid[1].fill_(float("-inf"))
        mid_o, mid_lse = self.mid
        table = (self.suffix_indptr, self.suffix_indices)
        tk.decode_partials(q, (k, v), table, self.scale, self.suffix_tiling, (mid_o, mid_lse))
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k.shape[1]
        grid = (self.num_groups, num_kv_heads * self.row_blocks, s0)
        _prefix_split_kernel[grid](
            q,
            k,
            v,
            self.group_rows,
            self.group_indptr,
            self.prefix_indptr,
            self.prefix_indices,
            mid_o,
            mid_lse,
            self.scale * LOG2E,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            NUM_HEADS=num_heads,
            GROUP=num_heads // num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=mid_o.shape[3],
            BLOCK_M=self.block_m,
            BLOCK_N=self.block_n,
            NUM_SPLITS=s0,
            MID_SPLITS=s1 + s0,
            MID_BASE=s1,
            DOT_PRECISION=tk.dot_precision(q.dtype),
            num_warps=self.num_warps,
        )
        out = torch.empty_like(q)
        tk.reduce_partials((mid_o, mid_lse), out)
        return out
