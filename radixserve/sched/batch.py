"""`Batch`: the one contract between the scheduler and the model runner.

The scheduler fills it on the host; `to_forward()` turns it into the model
layer's `ForwardBatch` plus the sampler's inputs. Request i contributes
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

from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.host import to_device
from radixserve.runtime.sampler import SamplingInputs
from radixserve.sched.request import Request


@dataclass
class Batch:
    reqs: list[Request]
    extend_lens: list[int]
    prefix_lens: list[int]
    input_ids: list[int]  # -1 where the id is in flight
    out_slots: np.ndarray  # [T] int64
    kv_indices: np.ndarray  # [sum(seq_lens)] int32
    sample: list[bool]  # request i samples a token at the end of its part
    sampling: SamplingInputs  # for the requests that sample, in batch order
    # Per request, rows (in the flat token axis) whose logits score the next
    # prompt token (prompt logprobs); the targets are those next tokens.
    prompt_lp_rows: list[list[int]] = field(default_factory=list)
    prompt_lp_targets: list[int] = field(default_factory=list)
    is_prefill: bool = False
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

    def to_forward(self, device: torch.device) -> ForwardBatch:
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
