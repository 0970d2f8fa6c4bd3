"""What every backend's decode graph states share: the check each plan makes of its batch,
the page-table buffer (`SharedPageTable`), and filling a device-planned state's page table
(`load_page_table`)."""

from __future__ import annotations

from typing import Protocol

import torch

from radixserve.runtime.attention.base import DecodeGraphState
from radixserve.runtime.forward_batch import ForwardBatch


def check_graph_batch(state: DecodeGraphState, batch: ForwardBatch) -> None:
    """`batch` must be a decode batch padded to the state's size, its contexts within its buffers."""
    if batch.batch_size != state.batch_size or not batch.is_decode:
        raise ValueError(
            f"graph state for {state.batch_size} decode rows got a batch of {batch.batch_size} "
            f"(decode={batch.is_decode})"
        )
    if batch.kv_indices.numel() > state.max_kv_tokens:
        raise ValueError(
            f"batch has {batch.kv_indices.numel()} context slots, state holds {state.max_kv_tokens}"
        )


class SharedPageTable:
    """The `kv_indices` buffer of a backend's decode graph states: one for all, since only one
    graph replays at a time and each replay's plan (or `step_fill`) refills it first. States
    are made largest first, so the first sizes it; a larger one after it gets its own."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buf: torch.Tensor | None = None

    def take(self, batch_size: int, max_kv_tokens: int) -> torch.Tensor:
        """int32 `[max_kv_tokens]` for a state of `batch_size` rows."""
        if batch_size <= 0 or max_kv_tokens < batch_size:
            raise ValueError(
                f"need batch_size >= 1 and max_kv_tokens >= batch_size, got {batch_size}, {max_kv_tokens}"
            )
        if self._buf is not None and self._buf.numel() >= max_kv_tokens:
            return self._buf[:max_kv_tokens]
        buf = torch.zeros(max_kv_tokens, dtype=torch.int32, device=self.device)
        if self._buf is None:
            self._buf = buf
        return buf


class PagedGraphState(Protocol):
    """A decode graph state whose kernels read the batch's page table from static buffers."""

    kv_indptr: torch.Tensor  # [bs + 1] int32, device
    kv_indices: torch.Tensor  # [max_kv_tokens] int32, device (a `SharedPageTable` buffer)


def load_page_table(state: PagedGraphState, batch: ForwardBatch) -> None:
    """Copy a padded decode batch's device page table into the state's buffers (queued, no sync)."""
    state.kv_indptr.copy_(batch.kv_indptr, non_blocking=True)
    state.kv_indices[: batch.kv_indices.numel()].copy_(batch.kv_indices, non_blocking=True)
