"""Cascade decode steps inside CUDA graphs (Triton decode kernels).

A graph fixes its kernels' grids, so a cascade graph of `bs` rows launches
level 0 over a fixed capacity of work items (`item_capacity`) and keeps a
fixed number of prefix partials per row (`GRAPH_PREFIX_SPLITS`); the step's
real items, its `skip` per row and its grouped rows are copied before each
replay into one device buffer (`CascadeStaging`), whose unused items have no
rows and do nothing. The page table is the plain graph state's of the same
size, which the graph's `step_fill` writes. Any step of at most `bs` rows in
at most `MAX_GRAPH_GROUPS` groups fits; others run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from radixserve.host_copy import PinnedStaging
from radixserve.runtime.attention import cascade_items as ci
from radixserve.runtime.attention.base import PLAIN_LAYER, LayerOptions
from radixserve.runtime.attention.triton_cascade import (
    CascadeLaunch,
    CascadeShape,
    block_m_for,
    prefix_warps_for,
    run_levels,
)
from radixserve.runtime.attention.triton_decode import TritonDecodeGraphState
from radixserve.runtime.cascade import CascadeGroups

# Graphs fix level 0's partial slots; a group's splits follow its prefix up to this many.
GRAPH_PREFIX_SPLITS = 16
MAX_GRAPH_GROUPS = 32  # more groups than this in one step: eager (item_capacity's margin)


class CascadeStaging:
    """The device buffer every cascade graph reads (`skip`, `group_rows`, `items` views at
    fixed addresses) and its pinned host side (`PinnedStaging`), sized for the largest graph."""

    def __init__(self, cap_rows: int, cap_items: int, device: torch.device) -> None:
        self.cap_rows, self.cap_items = cap_rows, cap_items
        self._pinned = PinnedStaging(ci.packed_size(cap_rows, cap_items), torch.int32, device)
        self.skip, self.group_rows, self.items = ci.views(self._pinned.device_buf, cap_rows, cap_items)

    @staticmethod
    def for_batch(max_bs: int, shape: CascadeShape, device: torch.device) -> CascadeStaging:
        """Room for the cascade graphs of up to `max_bs` rows."""
        cap = ci.item_capacity(max_bs, shape.group, block_m_for(max_bs * shape.group), shape.target_items)
        return CascadeStaging(max_bs, cap, device)

    def upload(self, work: ci.CascadeItems) -> None:
        self._pinned.upload(lambda host: ci.pack(work, self.cap_rows, self.cap_items, host))


@dataclass
class TritonCascadeGraphState:
    """A CUDA-graph cascade decode state of `batch_size` rows: the plain state's page table
    (the graph's `step_fill` writes it), the cascade staging's buffers and a fixed launch."""

    batch_size: int
    max_kv_tokens: int
    kv_indptr: torch.Tensor  # [bs + 1] int32: the plain graph state's
    kv_indices: torch.Tensor  # [max_kv_tokens] int32: likewise
    staging: CascadeStaging
    launch: CascadeLaunch
    shape: CascadeShape

    @staticmethod
    def make(
        plain: TritonDecodeGraphState, staging: CascadeStaging, shape: CascadeShape
    ) -> TritonCascadeGraphState:
        """From the plain Triton graph state of the same size."""
        bs = plain.batch_size
        block_m = block_m_for(bs * shape.group)  # its groups are not known yet
        cap = ci.item_capacity(bs, shape.group, block_m, shape.target_items)
        if cap > staging.cap_items or bs > staging.cap_rows:
            raise ValueError(
                f"cascade staging ({staging.cap_rows}, {staging.cap_items}) too small for bs={bs}"
            )
        launch = CascadeLaunch(
            plain.scale,
            replace(plain.tiling, block_n=shape.block_n),
            GRAPH_PREFIX_SPLITS,
            cap,
            block_m,
            shape.block_n,
            prefix_warps_for(block_m),
        )
        return TritonCascadeGraphState(
            bs,
            plain.max_kv_tokens,
            plain.kv_indptr,
            plain.kv_indices,
            staging,
            launch,
            shape,
        )

    def fits(self, groups: CascadeGroups) -> bool:
        """Any step of at most `batch_size` rows in at most `MAX_GRAPH_GROUPS` groups fits its
        capacity (`item_capacity`): each group adds at most one partly filled block."""
        return len(groups.rows) <= MAX_GRAPH_GROUPS

    def upload(self, groups: CascadeGroups, prefix_lens: np.ndarray) -> None:
        """This step's work list into the staging buffer; row i's context starts at the sum of
        the earlier rows' `prefix_lens + 1` in `kv_indices` (as `step_fill` lays it out)."""
        starts = ci.context_starts(prefix_lens + 1)
        shape = self.shape
        work = ci.cascade_items(
            groups, starts, shape.group, self.launch.block_m, shape.target_items, GRAPH_PREFIX_SPLITS
        )
        self.staging.upload(work)

    def run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], opts: LayerOptions = PLAIN_LAYER
    ) -> torch.Tensor:
        assert not opts.masked, "cascade steps serve models without windows or soft-caps"
        s = self.staging
        work = (s.skip[: self.batch_size], s.group_rows, s.items)
        return run_levels(q, cache, (self.kv_indptr, self.kv_indices), work, self.launch, opts)


class CascadeGraphs:
    """A backend's maker of cascade graph states (with the Triton decode): one per captured
    batch size, largest first, all reading one staging buffer that the first one sizes."""

    def __init__(self, shape: CascadeShape, device: torch.device) -> None:
        self.shape, self.device = shape, device
        self._staging: CascadeStaging | None = None

    def make(self, plain: TritonDecodeGraphState) -> TritonCascadeGraphState:
        """Beside the plain graph state `plain`, sharing its page table."""
        if self._staging is None:
            self._staging = CascadeStaging.for_batch(plain.batch_size, self.shape, self.device)
        return TritonCascadeGraphState.make(plain, self._staging, self.shape)
