"""`SteadyDecode`: the decode set of the last plain decode step, kept as row arrays.

In steady decode the requests of step n+1 are those of step n, less the ones
that finished or reached their length limit: nothing else can change which
requests decode. So when a plain decode step covered every running request
(none constrained by a grammar, whose jump-forward changes a request's
tokens), its requests, table rows, KV lengths and length limits are kept
here as numpy arrays, and the next step's decode set, its slot-table writes,
input ids and sampling inputs are a few array ops over them instead of
asking every request (`Request.can_decode`, `SamplingRows.inputs`).

Which request leaves the set is told, never searched for: `RunningSet.finish`
calls `drop`, and any other step (a prefill chunk, an admission, forced
tokens, a retraction) calls `reset`, after which the next plain decode step
is built the general way (sched/batch_build.py) and starts a new set.
`Request.kv_len` and `Request.pending` stay the requests' own fields, kept
current here (one increment each per step); `kv` mirrors `kv_len` row by row.

A request can decode while `0 < kv_len == num_tokens - 1` and it has tokens
left. The first part holds for every request of the set by construction (a
decode step adds one token and one KV slot, output processing turns the
pending token into an output one); the second is `kv_len + 1 < limit`, with
`limit = min(len(prompt) + max_tokens, max_context)` fixed per request.
"""

from __future__ import annotations

import numpy as np

from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.sampler import LOGPROBS, RARE, SamplingInputs
from radixserve.sched import batch_build
from radixserve.sched.batch import Batch
from radixserve.sched.request import Request
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.sampling_rows import SamplingRows


class SteadyDecode:
    def __init__(self) -> None:
        self.reqs: list[Request] | None = None  # None: no steady set (build the general way)
        self.batch: Batch | None = None  # the last batch built over the set
        self.inflight = False  # that batch's tokens are not processed yet
        self.changed = False  # `next_reqs` left some out: their cascade groups must be made again

    @property
    def active(self) -> bool:
        return self.reqs is not None

    def reset(self) -> None:
        self.reqs = self.batch = None
        self.inflight = False

    def start(self, batch: Batch, running: int, srows: SamplingRows) -> None:
        """`batch`, a plain decode step just built the general way, becomes the steady set if it
        holds all `running` requests and none has a grammar."""
        reqs = batch.reqs
        if len(reqs) != running or any(r.grammar is not None for r in reqs):
            self.reset()
            return
        self._set(reqs, batch.step.rows, batch.step.prefix_lens + 1, srows)
        self._limit = np.fromiter(
            (min(len(r.prompt_ids) + r.params.max_tokens, r.max_context) for r in reqs), np.int64, len(reqs)
        )
        self._prompt = np.fromiter((len(r.prompt_ids) for r in reqs), np.int64, len(reqs))
        self.batch, self.inflight = batch, True

    def _set(self, reqs: list[Request], rows: np.ndarray, kv: np.ndarray, srows: SamplingRows) -> None:
        self.reqs, self.rows, self.kv = reqs, rows, kv
        self._alive = np.ones(len(reqs), dtype=bool)
        self._index = {id(r): i for i, r in enumerate(reqs)}
        flags = srows.flags[rows]
        self._flags = flags
        self._union = int(np.bitwise_or.reduce(flags)) if len(flags) else 0
        self._params = [r.params for r in reqs]
        self._rare = np.flatnonzero(flags & RARE).tolist()
        self._top_lp = int(srows.top_logprobs[rows].max()) if self._union & LOGPROBS else 0

    def drop(self, req: Request) -> None:
        """`req` finished (or failed): it leaves the set."""
        if self.reqs is not None:
            i = self._index.get(id(req))
            if i is not None:
                self._alive[i] = False

    def reserve(self, ratio: float) -> int:
        """`sum(ceil(remaining_tokens * ratio))` over the set's live requests: a request's
        `remaining_tokens` is `limit - kv_len - 1` (at least 0) while `kv_len == num_tokens - 1`."""
        left = np.maximum(self._limit - self.kv - 1, 0)[self._alive]
        return int(np.ceil(left * ratio).sum())

    def processed(self, batch: Batch) -> None:
        if batch is self.batch:
            self.inflight = False

    def next_reqs(self, srows: SamplingRows) -> list[Request] | None:
        """The requests of the next decode step (`changed` says if some left); None without a set."""
        if self.reqs is None:
            return None
        keep = self._alive & (self.kv + 1 < self._limit)
        self.changed = not keep.all()
        if not self.changed:
            return self.reqs
        if not keep.any():
            self.reset()
            return None
        idx = np.flatnonzero(keep)
        reqs = [self.reqs[i] for i in idx.tolist()]
        limit, prompt = self._limit[idx], self._prompt[idx]
        self._set(reqs, self.rows[idx], self.kv[idx], srows)
        self._limit, self._prompt = limit, prompt
        return reqs

    def build(
        self, kv: RequestKV, srows: SamplingRows, slots: np.ndarray, groups: CascadeGroups | None
    ) -> Batch:
        """The next decode step over the set (after `next_reqs`), with its freshly allocated `slots`."""
        assert self.reqs is not None
        reqs, rows, kv_lens = self.reqs, self.rows, self.kv
        n = len(reqs)
        kv.slots[rows, kv_lens] = slots
        if self.inflight:  # every input is the token the step in flight samples
            input_ids = np.full(n, -1, dtype=np.int64)
        else:
            input_ids = np.fromiter(
                ((r.output_ids[-1] if r.output_ids else r.prompt_ids[-1]) for r in reqs), np.int64, n
            )
        sampling = self._sampling(rows, kv_lens)
        batch = batch_build.decode_batch(reqs, rows, kv_lens, input_ids, slots, sampling, srows, groups)
        self.kv = kv_lens + 1
        self.batch, self.inflight = batch, True
        return batch

    def _sampling(self, rows: np.ndarray, kv_lens: np.ndarray) -> SamplingInputs:
        inp = SamplingInputs(rows=rows, params=self._params, flags=self._union)
        inp.top_logprobs = self._top_lp
        if self._rare:  # the index of the token each samples: its outputs so far, pending included
            n_out = (kv_lens + 1 - self._prompt).tolist()
            for i in self._rare:
                req = self.reqs[i]  # type: ignore[index]
                inp.add_rare(i, req.params, int(self._flags[i]), n_out[i], req.eos_ids)
        return inp
