"""The check every decode graph state's plan makes of the batch it is planned for."""

from __future__ import annotations

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
