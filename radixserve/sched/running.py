"""`RunningSet`: the admitted requests (prefilling in chunks or decoding), and how they leave.

It owns the running list, the steady decode set over it (sched/steady.py) and
the outputs of aborted requests, and is the one place a request ends:
`finish` (a stop rule, a length limit, an abort), `fail` (its own data raised)
and `retract` (the pool ran dry: its KV goes into the tree and it waits again).
Which rows decode in the next step is asked here too (`decode_rows`), since
making room for them retracts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixserve.outputs import RequestOutput
from radixserve.sched import grammar
from radixserve.sched.config import SchedulerConfig
from radixserve.sched.output import make_output
from radixserve.sched.request import Request, Status
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.sampling_rows import SamplingRows
from radixserve.sched.steady import SteadyDecode


@dataclass(frozen=True)
class DecodeRows:
    reqs: list[Request]  # one token each
    jumps: list[Request]  # jump-forward requests: their forced tokens to extend
    retracted: list[Request]  # taken off to make room: the caller queues them again
    squeezed: bool  # the pool ran dry (a retraction or an abort): admit nobody this step


class RunningSet:
    def __init__(self, cfg: SchedulerConfig, kv: RequestKV, sampling_rows: SamplingRows) -> None:
        self.cfg = cfg
        self.kv = kv
        self.sampling_rows = sampling_rows
        self.reqs: list[Request] = []
        self.steady = SteadyDecode()  # the last plain decode step's requests, as row arrays
        self.retractions = 0
        # Process the step in flight before a decode step where a jump-forward may come
        # (SchedulerConfig.hold_for_jumps); tests and benchmarks turn it off on the CPU to
        # run as on CUDA, where a jump then discards the in-flight token.
        self.hold_for_jumps = cfg.hold_for_jumps
        self._aborted: list[RequestOutput] = []

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Request) -> None:
        self.reqs.append(req)

    def take_aborted(self) -> list[RequestOutput]:
        out, self._aborted = self._aborted, []
        return out

    @property
    def aborted_count(self) -> int:
        return len(self._aborted)

    # ---- how a request ends ----------------------------------------------------------------

    def finish(
        self, req: Request, reason: str, stop_reason: str | int | None = None, error: str | None = None
    ) -> None:
        """End `req` (running or not); an abort's output goes out with the next `take_aborted`."""
        req.status = Status.FINISHED
        req.finish_reason, req.stop_reason, req.error = reason, stop_reason, error
        self.steady.drop(req)
        if req in self.reqs:
            self.kv.release(req)
            self.reqs.remove(req)
        if reason == "abort":
            try:
                out = make_output(req, None, final=True)
            except Exception:  # noqa: BLE001 - its (lazy) detokenization failed: the abort carries no text
                req.detok = None
                out = make_output(req, None, final=True)
            self._aborted.append(out)

    def fail(self, req: Request, err: BaseException) -> None:
        """End one request with finish_reason "abort" because handling its data raised `err`."""
        req.detok = None  # it may be what failed: the abort output carries no text
        self.finish(req, "abort", error=f"this request failed: {type(err).__name__}: {err}")

    def retract(self, req: Request) -> None:
        """Take `req` off (its KV into the tree, unlocked); the caller queues it again."""
        self.steady.reset()
        self.kv.release(req)
        self.reqs.remove(req)
        req.status = Status.WAITING
        req.jumped = False  # its forced tokens are prefilled with the rest on readmission
        self.retractions += 1

    # ---- the next decode step ----------------------------------------------------------------

    def decode_reserve(self) -> int:
        """KV slots kept free for the running requests' decoding."""
        if self.steady.active:  # every running request is in the set (or has no tokens left)
            return self.steady.reserve(self.cfg.decode_reserve_ratio)
        return sum(self.reserve_of(r) for r in self.reqs)

    def reserve_of(self, req: Request) -> int:
        """One request's share of the decode reserve (`decode_reserve_ratio` of its remaining
        tokens, rounded up)."""
        return math.ceil(req.remaining_tokens * self.cfg.decode_reserve_ratio)

    def decode_rows(self, inflight: bool) -> DecodeRows | None:
        """Who decodes in the next step; None: wait for the step in flight instead."""
        steady = self.steady.next_reqs(self.sampling_rows)
        if steady is not None:
            if len(steady) <= self.kv.available():
                return DecodeRows(steady, [], [], squeezed=False)
            self.steady.reset()  # the pool runs dry: the general path retracts
        reqs = [r for r in self.reqs if r.can_decode]
        jumps = [r for r in self.reqs if r.jumped]  # forced tokens to extend (jump-forward)
        if inflight and self.hold_for_jumps and any(self._may_jump(r) for r in reqs):
            return None  # process the step in flight first: a jump then discards no token
        retracted: list[Request] = []
        while len(reqs) + sum(r.num_known - r.kv_len for r in jumps) > self.kv.available():
            if inflight:
                return None
            if len(reqs) + len(jumps) == 1:
                req = (reqs or jumps)[0]
                self.finish(req, "abort", error="the KV cache is too small for this request's context")
                return DecodeRows([], [], retracted, squeezed=True)
            victim = min(reqs + jumps, key=lambda r: (r.num_tokens, -r.arrival))
            (reqs if victim in reqs else jumps).remove(victim)
            self.retract(victim)
            retracted.append(victim)
        return DecodeRows(reqs, jumps, retracted, squeezed=bool(retracted))

    def _may_jump(self, req: Request) -> bool:
        return (
            req.pending > 0
            and req.grammar is not None
            and grammar.wants_jump(req, self.cfg.jump_forward_default)
        )
