"""Logit edits listed on the host per step: logit_bias, min_tokens suppression, a grammar's bitmask.

They change from step to step in ways only the host knows (which rows still
suppress EOS, which tokens a grammar allows now), so steps that have them run
the eager sampler (runtime/sampler.py), never a sampled graph. Each edit is a
few indexed writes whose indices are copied without stalling the stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from radixserve.host_copy import to_device


def apply_host_edits(
    logits: torch.Tensor,
    bias: list[tuple[int, Mapping[int, float]]],
    suppress: list[tuple[int, tuple[int, ...]]],
    bitmask: torch.Tensor | None,
    bitmask_rows: list[int] | None,
    vocab_size: int,
) -> None:
    """Edit `logits` [n, vocab] float32 in place: each (row index, logit_bias) of `bias`, then
    each (row index, ids) of `suppress` to -inf, then the xgrammar `bitmask` of `bitmask_rows`."""
    device = logits.device
    for i, b in bias:
        biased = to_device(list(b), torch.int64, device)
        logits[i, biased] += to_device(list(b.values()), torch.float32, device)
    for i, ids in suppress:
        logits[i, to_device(ids, torch.int64, device)] = float("-inf")
    if bitmask is not None:
        _apply_bitmask(logits, bitmask, bitmask_rows, vocab_size)


def _apply_bitmask(logits: torch.Tensor, mask: torch.Tensor, rows: list[int] | None, vocab_size: int) -> None:
    import xgrammar

    mask_rows: Any = rows  # Any: xgrammar's hint says a list; it takes a tensor too
    if logits.device.type == "cuda":
        # Both copies queued like kernels (see host_copy.py): a list of indices would make
        # xgrammar copy from pageable memory, a hidden sync on the forward pass.
        mask = mask.pin_memory().to(logits.device, non_blocking=True)
        if mask_rows is not None:
            mask_rows = to_device(mask_rows, torch.int32, logits.device)
    xgrammar.apply_token_bitmask_inplace(logits, mask, vocab_size=vocab_size, indices=mask_rows)
