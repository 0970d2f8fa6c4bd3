"""`Batch`: a step as the scheduler sees it (its requests and their lengths).

The scheduler fills it on the host; `to_step()` turns it into the runner's
`StepInput` (runtime/step.py). A decode step carries only per-request arrays
(`rows`, `prefix_lens`, `out_slots`, `input_ids`): the runner gathers its
context slots on the device from the request-to-slot table, so `kv_indices`
is None there; other steps carry their host-built `kv_indices`. Request i contributes
`extend_lens[i]` tokens starting at position `prefix_lens[i]`. A token whose
id is still being sampled on the device by the previous step (overlap mode)
is written as -1 in `input_ids`, and its request's row is listed in
`pending_rows`: the runner fills it from its on-device token buffer, so the id
never makes a round trip through the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from radixserve.host_copy import to_device
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.sampler import SamplingInputs
from radixserve.runtime.step import DecodeInputs, StepInput
from radixserve.sched.request import Request


@dataclass
class Batch:
    reqs: list[Request]
    extend_lens: list[int]
    prefix_lens: list[int]
    input_ids: list[int] | np.ndarray  # -1 where the id is in flight
    out_slots: np.ndarray  # [T] int64
    kv_indices: np.ndarray | None  # [sum(seq_lens)] int32; None for a decode step (built on the device)
    sample: list[bool]  # request i samples a token at the end of its part
    sampling: SamplingInputs  # for the requests that sample, in batch order
    # Per request, rows (in the flat token axis) whose logits score the next
    # prompt token (prompt logprobs); the targets are those next tokens.
    prompt_lp_rows: list[list[int]] = field(default_factory=list)
    prompt_lp_targets: list[int] = field(default_factory=list)
    is_prefill: bool = False
    rows: np.ndarray | None = None  # decode steps: [B] int64 table row of each request
    # Decode steps, for process(): whether each request is quiet, and its stop ids
    # ([B, k], padded with -2), as sched/sampling_rows.py had them when the step was built.
    quiet: np.ndarray | None = None
    stop_ids: np.ndarray | None = None

    @property
    def is_decode(self) -> bool:
        """Built by the decode path: one token per request, context gathered on the device."""
        return self.rows is not None

    # Decode only: rows sharing a context prefix (sched/cascade.py), for cascade attention.
    cascade: CascadeGroups | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    def pending(self) -> tuple[list[int], list[int]]:
        """(flat positions, request rows) of tokens to take from the device."""
        pos: list[int] = []
        rows: list[int] = []
        off = 0
        for r, e in zip(self.reqs, self.extend_lens):
            if self.input_ids[off + e - 1] < 0:
                pos.append(off + e - 1)
                rows.append(r.row)
            off += e
        return pos, rows

    def _positions(self) -> np.ndarray:
        if not self.is_prefill:  # one token per request, at its prefix length
            return np.asarray(self.prefix_lens, dtype=np.int64)
        return np.concatenate(
            [np.arange(p, p + e, dtype=np.int64) for p, e in zip(self.prefix_lens, self.extend_lens)]
        )

    def to_step(self, device: torch.device) -> StepInput:
        """The runner's input for this step (host arrays for decode, host-built tensors otherwise)."""
        if self.rows is not None:
            dec = DecodeInputs(
                rows=self.rows,
                prefix_lens=np.asarray(self.prefix_lens, dtype=np.int64),
                out_slots=self.out_slots,
                input_ids=np.asarray(self.input_ids, dtype=np.int64),
                cascade=self.cascade,
            )
            return StepInput(forward=None, decode=dec, sampling=self.sampling)
        pos, rows = self.pending()
        top_k = max((r.params.top_logprobs for r, lp in zip(self.reqs, self.prompt_lp_rows) if lp), default=0)
        return StepInput(
            forward=self.to_forward(device),
            decode=None,
            sampling=self.sampling,
            pending_pos=pos,
            pending_rows=rows,
            prompt_lp_targets=self.prompt_lp_targets,
            prompt_top_k=top_k,
        )

    def to_forward(self, device: torch.device) -> ForwardBatch:
        """The host-built forward batch of a step that has `kv_indices` (not a decode step)."""
        assert self.kv_indices is not None, "a decode step's forward batch is built by the runner"
        qo = np.zeros(len(self.reqs) + 1, dtype=np.int32)
        np.cumsum(self.extend_lens, out=qo[1:])
        kv = np.zeros(len(self.reqs) + 1, dtype=np.int32)
        np.cumsum([p + e for p, e in zip(self.prefix_lens, self.extend_lens)], out=kv[1:])
        # Logits rows: one per sampling request first, then the prompt-logprob rows.
        # None when that is just the last token of every request (the model's default,
        # and what CUDA-graph decode replays).
        wanted = [int(qo[i + 1]) - 1 for i, s in enumerate(self.sample) if s]
        for lp_rows in self.prompt_lp_rows:
            wanted.extend(lp_rows)
        rows = None if all(self.sample) and len(wanted) == len(self.reqs) else wanted

        def dev(a: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
            return to_device(a, dtype, device)

        return ForwardBatch(
            input_ids=dev(self.input_ids, torch.int64),
            positions=dev(self._positions(), torch.int64),
            out_slots=dev(self.out_slots, torch.int64),
            qo_indptr=dev(qo, torch.int32),
            kv_indptr=dev(kv, torch.int32),
            kv_indices=dev(self.kv_indices, torch.int32),
            extend_lens=list(self.extend_lens),
            prefix_lens=list(self.prefix_lens),
            logit_rows=None if rows is None else dev(rows, torch.int64),
            cascade=self.cascade,
        )
