"""The step contract: what the scheduler hands the runner, as plain host data.

Every step has one form. Request i of a step brings `extend_lens[i]` new tokens
(1 when it decodes, more for a prefill chunk or jump-forward's forced tokens)
at positions `prefix_lens[i]` onwards; its first `prefix_lens[i]` tokens
already have K/V in the pool. Tokens are laid out flat, request after request.

How the forward batch is made from it is the runner's choice, not a second
layout upstream (runtime/step_batch.py): when every request brings one token
the scheduler leaves `kv_indices` out and the runner gathers the context on
the device from the request-to-slot table (or a CUDA graph's fill kernel
does, runtime/step_fill.py), so host work per decode step does not grow
with the context; otherwise the scheduler lists the context slots itself.
What comes back is a `StepHandle` whose `result()` is the `StepResult`
(runtime/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.sampler import SamplingInputs


@dataclass(frozen=True)
class StepInput:
    """Everything the runner needs for one forward + sample (arrays are host numpy)."""

    # [B] int64: each request's row in the request-to-slot table, which is also its row
    # in the runner's per-request buffers (last sampled token, sampler state).
    rows: np.ndarray
    # [B] int64: tokens of the request whose K/V is already in the pool; its new tokens
    # take positions prefix_lens[i] .. prefix_lens[i] + extend_lens[i] - 1.
    prefix_lens: np.ndarray
    # [B] int64: new tokens of each request (all 1 in a decode step).
    extend_lens: np.ndarray
    # [T] int64, T = sum(extend_lens): the input tokens, or -1 for a request's last token
    # when the previous step is still sampling it (the runner takes it from its
    # on-device buffer of last tokens, so the id never makes a round trip to the host).
    input_ids: np.ndarray
    # [T] int64: the KV slot each new token writes (allocated by the scheduler; in a
    # decode step the runner also records it in the device table).
    out_slots: np.ndarray
    # [sum(prefix_lens + extend_lens)] int32: each request's context slots after the step,
    # request after request; None (only when every extend_len is 1): the runner gathers
    # them on the device from the request-to-slot table.
    kv_indices: np.ndarray | None
    # Sampling parameters of the requests that sample a token this step, in batch order.
    sampling: SamplingInputs
    # Flat token rows whose logits are wanted: one per sampling request, then the
    # prompt-logprob rows; None: the last token of every request (the decode case).
    logit_rows: np.ndarray | None = None
    # Prompt logprobs: per logits row after the sampling rows, the prompt token
    # whose logprob is wanted ...
    prompt_lp_targets: list[int] = field(default_factory=list)
    # ... and how many best alternatives to report for each (0: none).
    prompt_top_k: int = 0
    # Rows grouped by a shared context prefix, read once per group by a backend with
    # cascade attention (runtime/cascade.py); decode steps only; None: plain attention.
    cascade: CascadeGroups | None = None

    @staticmethod
    def decode(
        rows: np.ndarray,
        prefix_lens: np.ndarray,
        out_slots: np.ndarray,
        input_ids: np.ndarray,
        sampling: SamplingInputs,
        cascade: CascadeGroups | None = None,
    ) -> StepInput:
        """A decode step: one token per request, its context gathered by the runner."""
        return StepInput(
            rows=rows,
            prefix_lens=prefix_lens,
            extend_lens=np.ones(len(rows), dtype=np.int64),
            input_ids=input_ids,
            out_slots=out_slots,
            kv_indices=None,
            sampling=sampling,
            cascade=cascade,
        )

    def __post_init__(self) -> None:
        if self.kv_indices is None and self.num_tokens != self.batch_size:
            raise ValueError("a step without kv_indices must bring one token per request")

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def is_decode(self) -> bool:
        """One token per request, its context gathered on the device (no `kv_indices`)."""
        return self.kv_indices is None
