"""The step contract: what the scheduler hands the runner, as plain data.

A step is either a *decode* step (one new token per request), whose forward
batch the runner builds on the device from a few per-request arrays and the
device copy of the request-to-slot table (runtime/decode_inputs.py), or any
other step (prefill chunks, jump-forward extends), whose `ForwardBatch` the
scheduler built on the host. What comes back is a `StepHandle` whose
`result()` is the `StepResult` (runtime/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.sampler import SamplingInputs


@dataclass(frozen=True)
class DecodeInputs:
    """One token per request; request i is the i-th entry of every array (all int64, [B])."""

    # The request's row in the request-to-slot table, which is also its row in
    # the runner's per-request buffers (last sampled token, sampler state).
    rows: np.ndarray
    # Tokens of the request whose K/V is already in the pool: the new token's
    # position, and the table column its slot is written to.
    prefix_lens: np.ndarray
    # The KV slot the new token writes (allocated by the scheduler; the runner
    # also records it in the device table).
    out_slots: np.ndarray
    # The input token, or -1 where it is still being sampled by the previous
    # step (the runner then takes it from its on-device last-token buffer).
    input_ids: np.ndarray
    # Rows grouped by a shared context prefix, read once per group by a backend
    # with cascade attention (runtime/cascade.py); None: plain attention.
    cascade: CascadeGroups | None = None

    @property
    def batch_size(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class StepInput:
    """Everything the runner needs for one forward + sample."""

    # The forward pass's tensors, built by the host: set for every step that is
    # not a plain decode step; None for a decode step (see `decode`).
    forward: ForwardBatch | None
    # A decode step's per-request arrays, from which the runner builds the
    # forward batch on the device; None for other steps.
    decode: DecodeInputs | None
    # Sampling parameters of the requests that sample a token this step, in batch order.
    sampling: SamplingInputs
    # Non-decode steps: flat token positions whose input id is still being
    # sampled by the previous step (written as -1 in `forward.input_ids`) ...
    pending_pos: list[int] = field(default_factory=list)
    # ... and, for each, the request row whose last sampled token fills it.
    pending_rows: list[int] = field(default_factory=list)
    # Prompt logprobs: per logits row after the sampling rows, the prompt token
    # whose logprob is wanted.
    prompt_lp_targets: list[int] = field(default_factory=list)
    # How many best alternatives to report per prompt-logprob row (0: none).
    prompt_top_k: int = 0

    def __post_init__(self) -> None:
        if (self.forward is None) == (self.decode is None):
            raise ValueError("a StepInput has exactly one of `forward` and `decode`")
