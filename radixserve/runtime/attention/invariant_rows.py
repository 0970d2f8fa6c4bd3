"""Per new token of a step: its position and where its request's context starts in
`kv_indices`, from the batch's host lengths (no device read). The batch-invariant
backends attend each token on its own over keys 0..position, so these two numbers are
all that ties a token to the step it happens to be in."""

from __future__ import annotations

import numpy as np

from radixserve.runtime.forward_batch import ForwardBatch


def token_positions(batch: ForwardBatch) -> tuple[np.ndarray, np.ndarray]:
    """(positions, context starts), int64 `[T]` each, in the step's token order."""
    ext = np.asarray(batch.extend_lens, dtype=np.int64)
    pre = np.asarray(batch.prefix_lens, dtype=np.int64)
    kv_start = np.concatenate(([0], np.cumsum(pre + ext)[:-1]))
    first_row = np.concatenate(([0], np.cumsum(ext)[:-1]))
    req = np.repeat(np.arange(len(ext)), ext)
    pos = pre[req] + np.arange(int(ext.sum()), dtype=np.int64) - first_row[req]
    return pos, kv_start[req]
