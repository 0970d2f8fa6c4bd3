"""Shared-prefix (cascade) decode: the grouping a step carries, and what every backend derives from it.

When several decoding requests start with the same KV slots (the radix tree
hands every request that matched a prefix the tree's own slots), attention
over that prefix is the same key/value read for each of them. A cascade step
reads it once per group: level 0 attends each group's queries to the shared
prefix, level 1 attends each request to the rest of its context (its unique
suffix), and the two partial results merge exactly through their
log-sum-exp (FlashInfer's "recursive attention": `merge_state`).

The scheduler finds the groups (`sched/cascade.py`) and puts them on the
batch as `CascadeGroups`; rows not in any group attend to their whole
context in level 1 alone. Everything here is host arithmetic on lengths the
batch already carries, plus `gather_segments`, a few device ops that cut the
levels' slot lists out of the step's `kv_indices` without a host sync.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from radixserve.host_copy import to_device


@dataclass(frozen=True)
class CascadeGroups:
    """Decode rows grouped by a shared context prefix.

    Group g is the batch rows `rows[g]` (ascending, at least 2), whose first
    `prefix_lens[g]` context slots are the same slots, in the same order, for
    every row of the group; each prefix is shorter than every member's
    context (the token being decoded is always the request's own). A row
    belongs to at most one group.
    """

    rows: tuple[tuple[int, ...], ...]
    prefix_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.prefix_lens):
            raise ValueError("CascadeGroups: one prefix length per group")
        seen = [r for g in self.rows for r in g]
        if len(set(seen)) != len(seen) or any(len(g) < 2 for g in self.rows):
            raise ValueError("CascadeGroups: groups of >= 2 rows, each row in at most one group")
        if any(p < 1 for p in self.prefix_lens):
            raise ValueError("CascadeGroups: prefix lengths must be >= 1")

    @property
    def grouped_rows(self) -> list[int]:
        """Level 0's query rows: group after group."""
        return [r for g in self.rows for r in g]

    def row_prefix(self, batch_size: int) -> list[int]:
        """Per batch row, the shared prefix it reads in level 0 (0: not grouped)."""
        out = [0] * batch_size
        for g, p in zip(self.rows, self.prefix_lens):
            for r in g:
                out[r] = p
        return out

    @property
    def saved_tokens(self) -> int:
        """Context slots a step no longer reads: each group's prefix once instead of once per row."""
        return sum((len(g) - 1) * p for g, p in zip(self.rows, self.prefix_lens))

    def kv_tokens_read(self, seq_lens: list[int]) -> int:
        return sum(seq_lens) - self.saved_tokens


@dataclass
class CascadeIndices:
    """One step's two levels, as page tables over the KV pool (one slot per page)."""

    prefix_indices: torch.Tensor  # [sum(prefix_lens)] int32: each group's shared slots, group after group
    prefix_lens: list[int]  # per group
    group_sizes: list[int]  # per group: its queries (level 0's qo lengths)
    grouped_rows: torch.Tensor | None  # [sum(group_sizes)] int64 rows of level 0; None: all rows, in order
    suffix_indices: torch.Tensor  # [sum(suffix_lens)] int32: row i's context after its shared prefix
    suffix_lens: list[int]  # per row (>= 1)


def gather_segments(src: torch.Tensor, starts: list[int], lens: list[int]) -> torch.Tensor:
    """`cat([src[s:s+n] for s, n in zip(starts, lens)])` as a handful of device ops.

    The lengths are host ints, so the output size is known without asking the
    device; the work is proportional to the output, and nothing syncs.
    """
    total = sum(lens)
    device = src.device
    if total == 0:
        return src[:0]
    n = to_device(lens, torch.int64, device)
    seg = torch.repeat_interleave(torch.arange(len(lens), device=device), n, output_size=total)
    first = to_device([0, *itertools.accumulate(lens)][:-1], torch.int64, device)
    start = to_device(starts, torch.int64, device)
    pos = torch.arange(total, device=device) - first[seg] + start[seg]
    return src[pos]


def cascade_indices(kv_indices: torch.Tensor, seq_lens: list[int], groups: CascadeGroups) -> CascadeIndices:
    """Cut the step's flat `kv_indices` (row after row) into level 0 and level 1."""
    b = len(seq_lens)
    offsets = [0, *itertools.accumulate(seq_lens)]
    shared = groups.row_prefix(b)
    for g, p in zip(groups.rows, groups.prefix_lens):
        if g[-1] >= b or any(p >= seq_lens[r] for r in g):
            raise ValueError(f"cascade group {g} (prefix {p}) does not fit the batch's contexts")
    starts = [offsets[g[0]] for g in groups.rows]
    rows = groups.grouped_rows
    ordered = rows == list(range(b))
    device = kv_indices.device
    return CascadeIndices(
        prefix_indices=gather_segments(kv_indices, starts, list(groups.prefix_lens)),
        prefix_lens=list(groups.prefix_lens),
        group_sizes=[len(g) for g in groups.rows],
        grouped_rows=None if ordered else to_device(rows, torch.int64, device),
        suffix_indices=gather_segments(
            kv_indices, [o + s for o, s in zip(offsets, shared)], [n - s for n, s in zip(seq_lens, shared)]
        ),
        suffix_lens=[n - s for n, s in zip(seq_lens, shared)],
    )


def merge_lse(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two key sets from each part's output and natural-log
    log-sum-exp (`o [..., D]`, `lse [...]`): exact up to rounding."""
    lse = torch.logaddexp(lse_a, lse_b)
    wa = torch.exp(lse_a - lse)[..., None]
    wb = torch.exp(lse_b - lse)[..., None]
    return o_a * wa + o_b * wb, lse
