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

The scheduler composes three parts that own their state: `Admission` (the
waiting queue and what prefill takes, sched/admission.py), the `RunningSet`
(the admitted requests and how they end, sched/running.py) and the
`OutputProcessor` (sampled tokens -> stop rules, outputs, finished requests
released, sched/process.py); this class is the policy between them.
In overlap mode the next step is scheduled before the last one is processed:
a request then has `pending` tokens in flight, which the runner feeds forward
on the device. The picked requests become a `Batch` in `sched/batch_build.py`.
"""

from __future__ import annotations

import enum

import numpy as np

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.model.tokenizer import TokenizerLike
from radixserve.outputs import RequestOutput
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.runner import StepResult
from radixserve.sched import batch_build
from radixserve.sched.admission import Admission
from radixserve.sched.batch import Batch
from radixserve.sched.cascade import PrefixGrouper
from radixserve.sched.config import SchedulerConfig
from radixserve.sched.process import OutputProcessor
from radixserve.sched.request import Request
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.running import RunningSet
from radixserve.sched.sampling_rows import SamplingRows
from radixserve.sched.stats import SchedulerStats


class Sync(enum.Enum):
    NEEDED = "process the step in flight first, then ask again"


NEED_SYNC = Sync.NEEDED  # schedule()'s third answer (module doc)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        allocator: SlotAllocator,
        cache: RadixCache | None,
        table: ReqToSlotTable,
        tokenizer: TokenizerLike | None = None,
    ) -> None:
        self.cfg = config
        self.allocator = allocator
        self.cache = cache if config.enable_radix_cache else None
        self.kv = RequestKV(allocator, self.cache, table)
        self.sampling_rows = SamplingRows(table.max_requests)  # the sampler's per-row flags
        self.running = RunningSet(config, self.kv, self.sampling_rows)
        self.admission = Admission(config, self.cache, self.kv, self.running)
        self.outputs = OutputProcessor(config, self.running, tokenizer)
        self._chunking = False  # prefill first: the last step was a chunk with chunks left
        self.grouper = (
            PrefixGrouper(config.cascade_min_shared, config.cascade_min_saved)
            if config.cascade_min_shared and self.cache is not None
            else None
        )

    # ---- requests in and out -------------------------------------------------------------

    def add(self, req: Request) -> None:
        self.outputs.attach(req)
        self.admission.add(req)

    def abort(self, rid: str, why: str) -> None:
        """End every completion of request `rid`; their outputs come with the next `process`."""
        for req in self.admission.remove(rid):
            self.running.finish(req, "abort", error=why)
        for req in [r for r in self.running.reqs if r.rid == rid]:
            self.running.finish(req, "abort", error=why)

    def fail_request(self, req: Request, err: BaseException) -> None:
        """End one request with finish_reason "abort" because handling its data raised `err`."""
        self.running.fail(req, err)

    def take_aborted(self) -> list[RequestOutput]:
        return self.running.take_aborted()

    @property
    def has_work(self) -> bool:
        return bool(self.admission.waiting or self.running.reqs)

    # ---- scheduling ----------------------------------------------------------------------

    def schedule(self, inflight: bool = False) -> Batch | Sync | None:
        """The next step's batch, None when idle, or NEED_SYNC (see module doc)."""
        aborted = self.running.aborted_count
        if self.cfg.mixed_steps:
            batch = self._schedule_mixed(inflight)
        else:
            batch = self._schedule_prefill_first(inflight)
        # An abort in this call freed memory: the others get a chance at it first.
        if batch is None and not inflight and self.has_work and self.running.aborted_count == aborted:
            # Nothing can run and nothing in flight will free memory: without this the
            # request would wait forever. Fail the oldest one with the reason.
            req = self.running.reqs[0] if self.running.reqs else self.admission.pop_oldest()
            pool = self.allocator.num_slots
            self.running.finish(
                req, "abort", error=f"the request needs more KV cache than the pool holds ({pool} slots)"
            )
        return batch

    def _schedule_mixed(self, inflight: bool) -> Batch | Sync | None:
        """Decode first: every decoding request gets its token, prefill takes the rest of the budget."""
        rows = self._decode_rows(inflight)
        if rows is None:
            return NEED_SYNC
        reqs, jumps, squeezed = rows
        slots, forced = self._grow_decode(reqs, jumps)  # before any admission can take their slots
        budget = self.cfg.chunked_prefill_size - len(reqs) - sum(n for _, n in forced)
        if reqs:
            budget = self.admission.budget_beside_decode(budget)
        picked = [] if squeezed else self.admission.pick(budget)  # the pool ran dry: admit nobody
        return self._batch(reqs, slots, forced, picked)

    def _schedule_prefill_first(self, inflight: bool) -> Batch | Sync | None:
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
        picked = self.admission.pick(self.cfg.chunked_prefill_size)
        return self._batch([], None, [], picked) if picked else None

    def _schedule_decode(self, inflight: bool) -> Batch | Sync | None:
        rows = self._decode_rows(inflight)
        if rows is None:
            return NEED_SYNC
        reqs, jumps, _ = rows
        slots, forced = self._grow_decode(reqs, jumps)
        return self._batch(reqs, slots, forced, [])

    def _decode_rows(self, inflight: bool) -> tuple[list[Request], list[Request], bool] | None:
        """(decoding requests, jump-forward requests, whether the pool ran dry); retracted
        requests wait again. None: wait for the step in flight instead."""
        rows = self.running.decode_rows(inflight)
        if rows is None:
            return None
        for req in rows.retracted:  # each goes to the front: the last one retracted is first
            self.admission.requeue(req)
        return rows.reqs, rows.jumps, rows.squeezed

    def _grow_decode(
        self, reqs: list[Request], jumps: list[Request]
    ) -> tuple[np.ndarray | None, list[tuple[Request, int]]]:
        """Slots for one token per decoding request (one allocation) and for the forced tokens."""
        slots = None
        if reqs:
            got = self.kv.alloc(len(reqs))
            assert got is not None  # decode_rows made room
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
        steady = self.running.steady
        if not forced and not picked:
            if slots is None:
                return None
            if reqs is steady.reqs:  # the steady decode set: array ops only
                groups = self._groups(reqs, steady.changed)
                return steady.build(self.kv, self.sampling_rows, slots, groups)
            batch = batch_build.decode(self.kv, self.sampling_rows, reqs, slots, self._groups(reqs, True))
            steady.start(batch, len(self.running), self.sampling_rows)
            return batch
        steady.reset()
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

    def _groups(self, reqs: list[Request], changed: bool) -> CascadeGroups | None:
        """Shared-prefix groups for cascade attention (None when grouping is off)."""
        if self.grouper is None:
            return None
        return self.grouper.group([r.lock_node for r in reqs]) if changed else self.grouper.again()

    # ---- after a step --------------------------------------------------------------------

    def process(self, batch: Batch, result: StepResult) -> list[RequestOutput]:
        """The step's sampled tokens: stop rules, outputs, finished requests released."""
        self.running.steady.processed(batch)
        return self.outputs.process(batch, result)

    # ---- between steps (the engine's maintenance calls) -------------------------------------

    def flush_cache(self) -> bool:
        """Empty the radix cache; False (nothing done) while requests are running."""
        if self.has_work or self.cache is None:
            return self.cache is None and not self.has_work
        self.cache.reset()
        return True

    def stats(self) -> SchedulerStats:
        adm, out = self.admission, self.outputs
        return SchedulerStats(
            waiting=len(adm),
            running=len(self.running),
            free_slots=self.allocator.num_free,
            total_slots=self.allocator.num_slots,
            cached_tokens=self.cache.total_size if self.cache else 0,
            prompt_tokens=adm.prompt_tokens_admitted,
            prompt_tokens_cached=adm.cached_tokens_admitted,
            retractions=self.running.retractions,
            jump_forward_tokens=out.jump_forward_tokens,
            forward_passes_saved=out.jump_forward_tokens - out.jump_discarded,
            cascade_steps=self.grouper.steps if self.grouper is not None else 0,
            cascade_saved_slot_reads=self.grouper.saved_tokens if self.grouper is not None else 0,
        )

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running.reqs)
