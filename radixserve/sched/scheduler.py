"""The scheduling policy: who runs in the next step, and what happens after.

A step has a budget of `chunked_prefill_size` tokens. With `mixed_steps` (the
default) it is filled decode first:

- Decode: every running request whose prompt is done gets one token (and a
  jump-forward request its forced tokens). When the pool runs dry, the
  requests cheapest to redo (fewest tokens) are retracted: their KV goes into
  the tree (unlocked), they rejoin the queue with their output kept, and
  continue later with the same tokens. A step that retracted admits nobody.
- Prefill, in the rest of the budget: the request whose prompt is half-way
  through chunked prefill goes on first, then waiting requests, longest
  cached prefix first (FCFS once the queue is long, since ordering costs a
  tree match per request). A request is admitted only if its new tokens plus
  a reserve for the decoding of every running request fit in free +
  evictable KV. A request that shares an uncached prefix with one already
  picked this step waits a step, so it hits the cache instead of computing
  the same KV twice. Each chunk's KV goes into the radix tree as soon as the
  chunk is scheduled; a request samples only in the step of its last chunk.

So an arrival never pauses the running requests. With `mixed_steps=False`
("prefill first") a step is prefill or decode: prefill whenever a prompt can
be admitted, and after a chunk of a prompt with chunks left the next step
decodes, so a long prompt delays the others by one chunk at a time.

`process()` takes the step's sampled tokens, applies stop rules, builds the
outputs and releases finished requests (their KV into the tree, unlocked).
In overlap mode the next step is scheduled before the last one is processed:
a request then has `pending` tokens in flight, which the runner feeds forward
on the device. The picked requests become a `Batch` in `sched/batch_build.py`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.outputs import RequestOutput
from radixserve.runtime.runner import StepResult
from radixserve.sched import admission, batch_build, grammar, process
from radixserve.sched.batch import Batch
from radixserve.sched.cascade import PrefixGrouper
from radixserve.sched.config import SchedulerConfig
from radixserve.sched.detokenizer import Detokenizer
from radixserve.sched.output import make_output
from radixserve.sched.request import Request, Status
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.sampling_rows import SamplingRows
from radixserve.sched.steady import SteadyDecode

NEED_SYNC = object()  # schedule(): process the step in flight first, then ask again


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        allocator: SlotAllocator,
        cache: RadixCache | None,
        table: ReqToSlotTable,
        tokenizer: Any = None,
    ) -> None:
        self.cfg = config
        self.allocator = allocator
        self.cache = cache if config.enable_radix_cache else None
        self.kv = RequestKV(allocator, self.cache, table)
        self.sampling_rows = SamplingRows(table.max_requests)  # the sampler's per-row flags
        self.steady = SteadyDecode()  # the last plain decode step's requests, as row arrays
        self.tokenizer = tokenizer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._aborted: list[RequestOutput] = []
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0
        self.retractions = 0
        self._chunking = False  # prefill first: the last step was a chunk with chunks left
        self.jump_forward_tokens = 0  # output tokens appended by jump-forward
        self.jump_discarded = 0  # in-flight tokens dropped for a jump
        self.grouper = (
            PrefixGrouper(config.cascade_min_shared, config.cascade_min_saved)
            if config.cascade_min_shared and self.cache is not None
            else None
        )

    # ---- queue ---------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        p = req.params
        req.stream_every = self.cfg.stream_interval
        req.stream_gap = self.cfg.stream_gap_s
        req.detok = Detokenizer(
            self.tokenizer,
            p.stop,
            p.include_stop_str_in_output,
            p.skip_special_tokens,
            # Text is decoded when an output reads it (same text); stop strings decode per token.
            lazy=True,
            ids=req.output_ids,  # lazy: reads the outputs as they are appended
        )
        if req.grammar is not None and not req.output_ids and not (p.stop or p.stop_token_ids):
            self.jump_forward_tokens += grammar.jump_at_start(req, self.tokenizer)
        self.waiting.append(req)

    def abort(self, rid: str, why: str) -> None:
        """End every completion of request `rid`; their outputs come with the next `process`."""
        for req in [r for r in self.waiting if r.rid == rid]:
            self.waiting.remove(req)
            self.finish(req, "abort", error=why)
        for req in [r for r in self.running if r.rid == rid]:
            self.finish(req, "abort", error=why)

    def take_aborted(self) -> list[RequestOutput]:
        out, self._aborted = self._aborted, []
        return out

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def live_slots(self) -> list[torch.Tensor]:
        """Slots owned by running requests and not (yet) by the tree."""
        return self.kv.live_slots(self.running)

    # ---- scheduling ----------------------------------------------------------------------

    def schedule(self, inflight: bool = False) -> Batch | object | None:
        """The next step's batch, None when idle, or NEED_SYNC (see module doc)."""
        aborted = len(self._aborted)
        if self.cfg.mixed_steps:
            batch = self._schedule_mixed(inflight)
        else:
            batch = self._schedule_prefill_first(inflight)
        # An abort in this call freed memory: the others get a chance at it first.
        if batch is None and not inflight and self.has_work and len(self._aborted) == aborted:
            # Nothing can run and nothing in flight will free memory: without this the
            # request would wait forever. Fail the oldest one with the reason.
            req = self.running[0] if self.running else self.waiting.popleft()
            pool = self.allocator.num_slots
            self.finish(
                req, "abort", error=f"the request needs more KV cache than the pool holds ({pool} slots)"
            )
        return batch

    def _schedule_mixed(self, inflight: bool) -> Batch | object | None:
        """Decode first: every decoding request gets its token, prefill takes the rest of the budget."""
        rows = self._decode_rows(inflight)
        if rows is None:
            return NEED_SYNC
        reqs, jumps, retracted = rows
        slots, forced = self._grow_decode(reqs, jumps)  # before any admission can take their slots
        budget = self.cfg.chunked_prefill_size - len(reqs) - sum(n for _, n in forced)
        if reqs:
            budget = admission.mixed_budget(self, budget)
        picked = [] if retracted else self._pick_prefill(budget)  # the pool ran dry: admit nobody
        return self._batch(reqs, slots, forced, picked)

    def _schedule_prefill_first(self, inflight: bool) -> Batch | object | None:
        """A prefill step when a prompt can go on, else a decode step."""
        if self._chunking:  # a long prompt is half-way: the decoders have this step
            self._chunking = False
            batch = self._schedule_decode(inflight) or self._schedule_prefill()
            self._chunking = batch is NEED_SYNC  # the decoders' turn comes after the sync
        else:
            batch = self._schedule_prefill() or self._schedule_decode(inflight)
        if isinstance(batch, Batch) and batch.is_prefill:
            self._chunking = any(not r.prefill_done for r in batch.reqs)
        return batch

    def _schedule_prefill(self) -> Batch | None:
        picked = self._pick_prefill(self.cfg.chunked_prefill_size)
        return self._batch([], None, [], picked) if picked else None

    def _schedule_decode(self, inflight: bool) -> Batch | object | None:
        rows = self._decode_rows(inflight)
        if rows is None:
            return NEED_SYNC
        reqs, jumps, _ = rows
        slots, forced = self._grow_decode(reqs, jumps)
        return self._batch(reqs, slots, forced, [])

    def _pick_prefill(self, budget: int) -> list[tuple[Request, int]]:
        return admission.pick_prefill(self, budget)

    def _decode_reserve(self, extra: tuple[Request, ...] = ()) -> int:
        return admission.decode_reserve(self, extra)

    def _decode_rows(self, inflight: bool) -> tuple[list[Request], list[Request], bool] | None:
        """(decoding requests, jump-forward requests with forced tokens, whether any was
        retracted or aborted to make room); None: wait for the step in flight instead."""
        steady = self.steady.next_reqs(self.sampling_rows)
        if steady is not None:
            if len(steady) <= self.kv.available():
                return steady, [], False
            self.steady.reset()  # the pool runs dry: the general path retracts
        reqs = [r for r in self.running if r.can_decode]
        jumps = [r for r in self.running if r.jumped]  # forced tokens to extend (jump-forward)
        if inflight and self.cfg.hold_for_jumps and any(self._may_jump(r) for r in reqs):
            return None  # process the step in flight first: a jump then discards no token
        retracted = False
        while len(reqs) + sum(r.num_known - r.kv_len for r in jumps) > self.kv.available():
            if inflight:
                return None
            retracted = True
            if len(reqs) + len(jumps) == 1:
                req = (reqs or jumps)[0]
                self.finish(req, "abort", error="the KV cache is too small for this request's context")
                return [], [], True
            victim = min(reqs + jumps, key=lambda r: (r.num_tokens, -r.arrival))
            (reqs if victim in reqs else jumps).remove(victim)
            self._retract(victim)
        return reqs, jumps, retracted

    def _may_jump(self, req: Request) -> bool:
        return (
            req.pending > 0
            and req.grammar is not None
            and grammar.wants_jump(req, self.cfg.jump_forward_default)
        )

    def _grow_decode(
        self, reqs: list[Request], jumps: list[Request]
    ) -> tuple[np.ndarray | None, list[tuple[Request, int]]]:
        """Slots for one token per decoding request (one allocation) and for the forced tokens."""
        slots = None
        if reqs:
            got = self.kv.alloc(len(reqs))
            assert got is not None  # _decode_rows made room
            slots = got.numpy()
        forced = [(r, r.num_known - r.kv_len) for r in jumps]
        for r, n in forced:
            grown = self.kv.grow(r, n)
            assert grown
        return slots, forced

    def _batch(
        self,
        reqs: list[Request],
        slots: np.ndarray | None,
        forced: list[tuple[Request, int]],
        picked: list[tuple[Request, int]],
    ) -> Batch | None:
        """Decode rows first, then forced tokens, then prefill chunks; None when all are empty."""
        if not forced and not picked:
            if slots is None:
                return None
            if reqs is self.steady.reqs:  # the steady decode set: array ops only
                groups = self._groups(reqs, self.steady.changed)
                return self.steady.build(self.kv, self.sampling_rows, slots, groups)
            batch = batch_build.decode(self.kv, self.sampling_rows, reqs, slots)
            batch.cascade = self._groups(reqs, True)
            self.steady.start(batch, len(self.running), self.sampling_rows)
            return batch
        self.steady.reset()
        if slots is not None:
            self.kv.put_decode_slots(reqs, slots)
        batch = batch_build.extend(self.kv, self.sampling_rows, [(r, 1) for r in reqs] + forced + picked)
        for r, _ in forced:  # only now: until built, a jumped request is no chunked prefill to pick
            r.jumped = False
        if self.cache is not None:
            # Prompt KV goes into the tree as soon as it is scheduled (stream order
            # makes later readers see it computed), so requests sharing the prefix
            # hit it while this one is still decoding.
            for req, _ in picked:
                self.kv.cache_prefix(req)
        return batch

    def _groups(self, reqs: list[Request], changed: bool) -> Any:
        """Shared-prefix groups for cascade attention (None when grouping is off)."""
        if self.grouper is None:
            return None
        return self.grouper.group([r.lock_node for r in reqs]) if changed else self.grouper.again()

    def _retract(self, req: Request) -> None:
        self.steady.reset()
        self.kv.release(req)
        self.running.remove(req)
        req.status = Status.WAITING
        req.jumped = False  # its forced tokens are prefilled with the rest on readmission
        self.retractions += 1
        self.waiting.appendleft(req)

    def finish(
        self, req: Request, reason: str, stop_reason: str | int | None = None, error: str | None = None
    ) -> None:
        req.status = Status.FINISHED
        req.finish_reason, req.stop_reason, req.error = reason, stop_reason, error
        self.steady.drop(req)
        if req in self.running:
            self.kv.release(req)
            self.running.remove(req)
        if reason == "abort":
            try:
                out = make_output(req, None, final=True)
            except Exception:  # noqa: BLE001 - its (lazy) detokenization failed: the abort carries no text
                req.detok = None
                out = make_output(req, None, final=True)
            self._aborted.append(out)

    # ---- after a step --------------------------------------------------------------------

    def process(self, batch: Batch, result: StepResult) -> list[RequestOutput]:
        """The step's sampled tokens: stop rules, outputs, finished requests released (sched/process.py)."""
        self.steady.processed(batch)
        return process.process(self, batch, result)

    def fail_request(self, req: Request, err: BaseException) -> None:
        """End one request with finish_reason "abort" because handling its data raised `err`."""
        req.detok = None  # it may be what failed: the abort output carries no text
        self.finish(req, "abort", error=f"this request failed: {type(err).__name__}: {err}")

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running)
