"""Shared-prefix (cascade) decode attention in Triton: the prefix read once per group.

A cascade step (runtime/cascade.py) has two levels. Here both write partial
results into one buffer of partials per (row, query head), and the decode
kernel's reduction merges them all by their log-sum-exp, which is exact:

- level 1, every row over its own suffix: the decode split kernel told to
  skip each row's shared prefix (`skip`), its `s1` splits in partials
  `0..s1-1` (partial 0 always holds the token being decoded, so the merge's
  maximum is finite); it also clears level 0's slots to -inf;
- level 0, each group's queries over its shared prefix: `_prefix_items_kernel`,
  one program per (work item, KV head); an item is a block of up to BLOCK_M
  query tile rows (a group's rows times the GQA heads of one KV head) over
  one split of the group's prefix (cascade_items.py builds the list on the
  host). So each prefix K/V tile is loaded once for up to BLOCK_M query rows,
  and a lone group of 16-64 rows still fills the GPU through the splits.
  Split j of a group goes to partial `s1 + j`.

Neither level copies a slot list: both read the step's `kv_indptr` /
`kv_indices` (a group's prefix is its first row's first slots). So the same
kernels run eagerly (`TritonCascadePlan`, launched over exactly the step's
items) and inside CUDA graphs (triton_cascade_graph.py, launched over a
fixed capacity of items whose unused entries do nothing). Used by the Triton
backend and by the FlashInfer backend's Triton decode; checked against the
torch reference under the interpreter on the CPU (tests/runtime/test_backends.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import triton
import triton.language as tl

from radixserve.host_copy import to_device
from radixserve.runtime.attention import cascade_items as ci
from radixserve.runtime.attention import triton_kernels as tk
from radixserve.runtime.attention.base import PLAIN_LAYER, LayerOptions
from radixserve.runtime.attention.triton_decode import decode_tiling
from radixserve.runtime.attention.triton_softmax import (
    LOG2E,
    attend_tile,
    fp8_logit_scale,
    fp8_output,
    kv_args,
    normalized,
)
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch

# Level 0's programs per SM to aim for. One wave: on the H200 (benchmarks/gpu_cascade_tune.py,
# W5's shape) 16 splits of a 16-row group beat 32 by 1.2x, and 8 splits of a 64-row group in
# 128-row blocks beat 16 in 64-row blocks by 1.15x: fewer splits write fewer partials to merge.
_WAVES = 1
_MAX_PREFIX_SPLITS = 32


@triton.jit
def _prefix_items_kernel(
    Q,
    K,
    V,
    group_rows,
    items,
    kv_indices,
    Mid_O,
    Mid_LSE,
    sm_scale_log2,
    item_stride,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    k_scale,
    v_scale,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MID_SPLITS: tl.constexpr,
    MID_BASE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One program: work item w (cascade_items.py: a block of one group's query rows over one
    split of its prefix), KV head hk. An item without tile rows loads and stores nothing.
    KV_FP8: an FP8 pool (`attend_tile`)."""
    sm_scale_log2 = fp8_logit_scale(sm_scale_log2, k_scale, KV_FP8)
    w = tl.program_id(0)
    hk = tl.program_id(1)
    row0 = tl.load(items + 0 * item_stride + w)  # ROW0
    n_tile = tl.load(items + 1 * item_stride + w)  # TILE
    block = tl.load(items + 2 * item_stride + w)  # BLOCK
    lo = tl.load(items + 3 * item_stride + w)  # KEY_LO
    hi = tl.load(items + 4 * item_stride + w)  # KEY_HI
    split = tl.load(items + 5 * item_stride + w)  # SPLIT
    # Tile row m is query head hk*GROUP + m % GROUP of the group's row m // GROUP.
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < n_tile
    rows = tl.load(group_rows + row0 + offs_m // GROUP, mask=m_mask, other=0).to(tl.int64)
    heads = hk * GROUP + offs_m % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        slots = tl.load(kv_indices + offs_n, mask=n_mask, other=0).to(tl.int64)
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
            1.0,
            m_i,
            l_i,
            acc,
            DOT_PRECISION,
            False,  # no soft-cap: cascade steps serve plain models only
            KV_FP8,
        )

    out, lse = normalized(acc, l_i, m_i)
    out = fp8_output(out, v_scale, KV_FP8)
    part = (rows * NUM_HEADS + heads) * MID_SPLITS + MID_BASE + split
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

    @property
    def target_items(self) -> int:
        """Level 0's items for about `_WAVES` programs per SM (its grid is items x KV heads)."""
        return max(1, _WAVES * self.num_sms // self.num_kv_heads)


def block_m_for(tile_rows: int) -> int:
    """Query tile rows per level-0 item for groups of up to `tile_rows` (rows x GQA heads):
    each prefix tile is loaded once per block, so large groups take the largest block whose
    fp32 accumulator still fits in registers (128 x head dim, with `prefix_warps_for`'s 8 warps)."""
    return min(128, max(16, triton.next_power_of_2(tile_rows)))


def prefix_warps_for(block_m: int) -> int:
    """Level 0's warps per program: 8 for 128-row blocks, 4 below (the sweep's best for each)."""
    return 8 if block_m >= 128 else 4


@dataclass(frozen=True)
class CascadeLaunch:
    """How one step's two levels are launched: level 1's tiling, level 0's grid and tiles."""

    scale: float
    suffix_tiling: tk.DecodeTiling  # level 1: the decode split kernel, its splits first
    prefix_splits: int  # level 0's partial slots per row, after level 1's
    grid_items: int  # level 0's programs per KV head: the step's items, or a graph's capacity
    block_m: int
    block_n: int
    prefix_warps: int = 4  # level 0's warps per program
    prefix_stages: int = 3  # level 0's software pipelining depth (Triton's default)


def run_levels(
    q: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    table: tuple[torch.Tensor, torch.Tensor],
    work: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    launch: CascadeLaunch,
    opts: LayerOptions = PLAIN_LAYER,
) -> torch.Tensor:
    """q `[B, Hq, D]` over the layer's `(k, v)` buffers (`[S, Hkv, D]` or their page-size-1
    views) -> `[B, Hq, D]`. `table`: the step's `kv_indptr`, `kv_indices`; `work`: the device
    copies of `skip`, `group_rows` and `items` (cascade_items.py, items `[FIELDS, >= grid_items]`);
    `opts`: the layer's, for an FP8 pool's scales (no window or soft-cap here).

    Allocates its partials, launches three kernels and reads nothing on the host: capturable."""
    k, v = tk.token_rows(cache)
    q = tk.check_qkv(q, k, v)
    skip, group_rows, items = work
    s1 = launch.suffix_tiling.splits
    mid_o, mid_lse = tk.new_partials(q, s1 + launch.prefix_splits)
    # Level 1 also clears level 0's slots (to -inf) of every row: rows outside the groups, and
    # splits a group does not use, then count for nothing in the merge.
    tk.decode_partials(q, (k, v), table, launch.scale, launch.suffix_tiling, (mid_o, mid_lse), skip, opts)
    prefix_level(q, (k, v), group_rows, items, table[1], (mid_o, mid_lse), launch, opts)
    out = torch.empty_like(q)
    tk.reduce_partials((mid_o, mid_lse), out)
    return out


def prefix_level(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    group_rows: torch.Tensor,
    items: torch.Tensor,
    kv_indices: torch.Tensor,
    mid: tuple[torch.Tensor, torch.Tensor],
    launch: CascadeLaunch,
    opts: LayerOptions = PLAIN_LAYER,
) -> None:
    """Level 0 alone: each item's partial into slot `s1 + SPLIT` of `mid` (`kv`: `[S, Hkv, D]`)."""
    k, v = kv
    mid_o, mid_lse = mid
    num_heads, head_dim = q.shape[1], q.shape[2]
    _prefix_items_kernel[(launch.grid_items, k.shape[1])](
        q,
        k,
        v,
        group_rows,
        items,
        kv_indices,
        mid_o,
        mid_lse,
        launch.scale * LOG2E,
        items.stride(0),
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        NUM_HEADS=num_heads,
        GROUP=num_heads // k.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=mid_o.shape[3],
        BLOCK_M=launch.block_m,
        BLOCK_N=launch.block_n,
        MID_SPLITS=mid_lse.shape[2],
        MID_BASE=launch.suffix_tiling.splits,
        DOT_PRECISION=tk.dot_precision(q.dtype),
        num_warps=launch.prefix_warps,
        num_stages=launch.prefix_stages,
        **kv_args(opts),
    )


@dataclass
class TritonCascadePlan:
    """An eager cascade step: its work list on the device and its launch; `run` per layer."""

    table: tuple[torch.Tensor, torch.Tensor]  # the step's kv_indptr, kv_indices
    work: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # skip, group_rows, items
    launch: CascadeLaunch

    @property
    def prefix_splits(self) -> int:
        return self.launch.prefix_splits

    @staticmethod
    def build(batch: ForwardBatch, groups: CascadeGroups, shape: CascadeShape) -> TritonCascadePlan:
        seq = np.asarray(batch.seq_lens, dtype=np.int64)
        block_m = block_m_for(max(len(g) for g in groups.rows) * shape.group)
        work = ci.cascade_items(
            groups, ci.context_starts(seq), shape.group, block_m, shape.target_items, _MAX_PREFIX_SPLITS
        )
        device = batch.kv_indices.device
        tiling = decode_tiling(
            batch.batch_size, shape.num_kv_heads, shape.num_sms, int((seq - work.skip).max())
        )
        launch = CascadeLaunch(
            shape.scale,
            replace(tiling, block_n=shape.block_n),
            work.splits,
            work.num_items,
            block_m,
            shape.block_n,
            prefix_warps_for(block_m),
        )
        b, w = batch.batch_size, work.num_items
        host = np.empty(ci.packed_size(b, w), dtype=np.int32)
        ci.pack(work, b, w, host)
        dev = ci.views(to_device(host, torch.int32, device), b, w)
        return TritonCascadePlan((batch.kv_indptr, batch.kv_indices), dev, launch)

    def run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], opts: LayerOptions = PLAIN_LAYER
    ) -> torch.Tensor:
        assert not opts.masked, "cascade steps serve models without windows or soft-caps"
        return run_levels(q, cache, self.table, self.work, self.launch, opts)
