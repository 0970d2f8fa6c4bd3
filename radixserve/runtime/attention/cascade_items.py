"""The prefix level of a Triton cascade step as a flat work list, built on the host (numpy).

The Triton cascade (triton_cascade.py) runs level 0, each group's queries over
its shared prefix, as one program per (work item, KV head). An item is one
block of up to `block_m` query rows of one group (rows times the GQA heads
that share a KV head) over one split of that group's prefix. The prefix is
not copied anywhere: it is the first `prefix_len` slots of the group's first
row in the step's `kv_indices`, which every member's context starts with; and
level 1 (each row over the rest of its context) is the plain decode kernel
told to skip each row's first `skip[row]` slots.

So a step's whole cascade input is three small int32 arrays the host computes
from lengths it already has: `skip` per row, the grouped rows, and the items.
A CUDA graph holds them in fixed buffers of a capacity (`pack`), and its
launch grid is that capacity: items past the step's count have no rows and
do nothing. Eager steps launch exactly their items.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixserve.runtime.cascade import CascadeGroups

# The fields of one item, in this order (rows of `CascadeItems.items`):
#   ROW0:   the group's first entry in `group_rows`
#   TILE:   the group's query tile rows (its rows times the GQA group); 0: an empty item
#   BLOCK:  which block of `block_m` tile rows
#   KEY_LO, KEY_HI: the item's keys, as offsets into the step's `kv_indices`
#   SPLIT:  the partial slot of level 0 the item writes (after level 1's)
ROW0, TILE, BLOCK, KEY_LO, KEY_HI, SPLIT = range(6)
FIELDS = 6
MIN_KEYS_PER_SPLIT = 128  # a shorter split costs more in merging than it saves


@dataclass(frozen=True)
class CascadeItems:
    """One step's cascade input (all int32)."""

    skip: np.ndarray  # [B]: the shared prefix each row's level 1 skips (0: not grouped)
    group_rows: np.ndarray  # [R]: the grouped batch rows, group after group
    items: np.ndarray  # [FIELDS, W]: level 0's work items
    splits: int  # the most prefix splits of any group: level 0's partial slots

    @property
    def num_items(self) -> int:
        return int(self.items.shape[1])


def _excl_cumsum(a: np.ndarray) -> np.ndarray:
    out = np.zeros_like(a)
    np.cumsum(a[:-1], out=out[1:])
    return out


def context_starts(seq_lens: np.ndarray) -> np.ndarray:
    """Where each row's context starts in a step's `kv_indices` (contexts back to back)."""
    return _excl_cumsum(np.asarray(seq_lens, dtype=np.int64))


def cascade_items(
    groups: CascadeGroups,
    kv_starts: np.ndarray,
    gqa: int,
    block_m: int,
    target_items: int,
    max_splits: int,
) -> CascadeItems:
    """The work list of a step whose row i's context starts at `kv_starts[i]` in `kv_indices`.

    Splits: as many per group as keep about `target_items` items in all (the grid is items x
    KV heads, so the caller asks for a few programs per SM), a power of two at most
    `max_splits`, and none shorter than `MIN_KEYS_PER_SPLIT` keys.
    """
    b = len(kv_starts)
    sizes = np.array([len(g) for g in groups.rows], dtype=np.int64)
    plen = np.array(groups.prefix_lens, dtype=np.int64)
    skip = np.zeros(b, dtype=np.int32)
    group_rows = np.array(groups.grouped_rows, dtype=np.int64)
    skip[group_rows] = np.repeat(plen, sizes)
    tiles = sizes * gqa
    blocks = -(-tiles // block_m)
    want = max(1, min(max_splits, target_items // max(1, int(blocks.sum()))))
    s = 1 << (want.bit_length() - 1)
    splits = np.clip(plen // MIN_KEYS_PER_SPLIT, 1, s)
    per_group = blocks * splits
    gid = np.repeat(np.arange(len(sizes)), per_group)
    local = np.arange(int(per_group.sum())) - np.repeat(_excl_cumsum(per_group), per_group)
    sg = splits[gid]
    split_len = -(-plen // splits)
    sp = local % sg
    lo = sp * split_len[gid]
    hi = np.minimum(lo + split_len[gid], plen[gid])
    base = kv_starts[np.array([g[0] for g in groups.rows], dtype=np.int64)][gid]
    items = np.stack([_excl_cumsum(sizes)[gid], tiles[gid], local // sg, base + lo, base + hi, sp]).astype(
        np.int32
    )
    return CascadeItems(skip, group_rows.astype(np.int32), items, int(splits.max()))


def item_capacity(batch_size: int, gqa: int, block_m: int, target_items: int) -> int:
    """Items a graph of `batch_size` rows has room for: the target, or more where the rows'
    blocks alone need it (every group rounds its tile rows up to a block: + 32 groups)."""
    return max(target_items, -(-batch_size * gqa // block_m) + 32)


def packed_size(cap_rows: int, cap_items: int) -> int:
    return 2 * cap_rows + FIELDS * cap_items


def views(
    buf: torch.Tensor, cap_rows: int, cap_items: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`skip`, `group_rows` and `items` of a packed buffer (`pack`'s layout) on the device."""
    return buf[:cap_rows], buf[cap_rows : 2 * cap_rows], buf[2 * cap_rows :].view(FIELDS, cap_items)


def pack(work: CascadeItems, cap_rows: int, cap_items: int, out: np.ndarray) -> None:
    """Write `work` into `out` (int32 [packed_size]): `[skip[cap_rows], group_rows[cap_rows],
    items[FIELDS, cap_items]]`, zeros beyond the step's rows and items (empty items)."""
    b, r, w = len(work.skip), len(work.group_rows), work.num_items
    if b > cap_rows or w > cap_items:
        raise ValueError(f"cascade step of {b} rows / {w} items exceeds {cap_rows} / {cap_items}")
    out[:] = 0
    out[:b] = work.skip
    out[cap_rows : cap_rows + r] = work.group_rows
    out[2 * cap_rows :].reshape(FIELDS, cap_items)[:, :w] = work.items
