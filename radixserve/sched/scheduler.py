"""The scheduling policy: who runs in the next step, and what happens after.

Each step is either a prefill step or a decode step ("prefill first"):

- Prefill: the request whose prompt is half-way through chunked prefill goes
  on first, then waiting requests, longest cached prefix first (FCFS once the
  queue is long, since ordering costs a tree match per request). A request is
  admitted only if its new tokens plus a reserve for the decoding of every
  running request fit in free + evictable KV. A request that shares an
  uncached prefix with one already picked this step waits a step, so it hits
  the cache instead of computing the same KV twice. Each chunk's KV goes into
  the radix tree as soon as the chunk is scheduled.
- Chunks and decodes alternate: after a chunk of a prompt with chunks left,
  the next step decodes the running requests (if any), so a long prompt
  delays the others by one chunk at a time, not by its whole prefill.
- Decode: every running request whose prompt is done gets one token. When
  the pool runs dry, the requests cheapest to redo (fewest tokens) are
  retracted: their KV goes into the tree (unlocked), they rejoin the queue
  with their output kept, and continue later with the same tokens.

`process()` takes the step's sampled tokens, applies stop rules, builds the
outputs and releases finished requests (their KV into the tree, unlocked).
In overlap mode the next step is scheduled before the last one is processed:
a request then has `pending` tokens in flight, which the runner feeds forward
on the device.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.outputs import RequestOutput, TokenLogprob
from radixserve.runtime.runner import StepResult
from radixserve.runtime.sampler import SamplingInputs
from radixserve.sched import grammar
from radixserve.sched.batch import Batch
from radixserve.sched.cascade import PrefixGrouper
from radixserve.sched.detokenizer import Detokenizer
from radixserve.sched.output import make_output, stop_rule
from radixserve.sched.request import Request, Status
from radixserve.sched.request_kv import RequestKV

NEED_SYNC = object()  # schedule(): process the step in flight first, then ask again


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192  # prefill tokens per step
    enable_radix_cache: bool = True
    decode_reserve_ratio: float = 0.25  # fraction of each request's remaining tokens kept free
    lpm_max_queue: int = 128  # longest-prefix-first up to this queue length, FCFS beyond
    defer_shared_min: int = 32  # shared uncached tokens that make a request wait a step
    # Shared-prefix (cascade) decode: the least prefix, in tokens, that a group of running
    # requests must share to read it once (sched/cascade.py); 0 turns grouping off.
    cascade_min_shared: int = 0
    cascade_min_saved: int = 0  # ...and the least slot reads a step's groups must save to be used


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
        self.tokenizer = tokenizer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._aborted: list[RequestOutput] = []
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0
        self.retractions = 0
        self._chunking = False  # the last step was a chunk of a prompt with chunks left
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
        req.detok = Detokenizer(self.tokenizer, p.stop, p.include_stop_str_in_output, p.skip_special_tokens)
        self.waiting.append(req)

    def abort(self, rid: str, why: str) -> None:
        """End every completion of request `rid`; their outputs come with the next `process`."""
        for req in [r for r in self.waiting if r.rid == rid]:
            self.waiting.remove(req)
            self._finish(req, "abort", error=why)
        for req in [r for r in self.running if r.rid == rid]:
            self._finish(req, "abort", error=why)

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
        if self._chunking:  # a long prompt is half-way: let the decoders have this step
            self._chunking = False
            batch = self._schedule_decode(inflight) or self._schedule_prefill()
        else:
            batch = self._schedule_prefill() or self._schedule_decode(inflight)
        if isinstance(batch, Batch) and batch.is_prefill:
            self._chunking = any(not r.prefill_done for r in batch.reqs)
        # An abort in this call freed memory: the others get a chance at it first.
        if batch is None and not inflight and self.has_work and len(self._aborted) == aborted:
            # Nothing can run and nothing in flight will free memory: without this the
            # request would wait forever. Fail the oldest one with the reason.
            req = self.running[0] if self.running else self.waiting.popleft()
            pool = self.allocator.num_slots
            self._finish(
                req, "abort", error=f"the request needs more KV cache than the pool holds ({pool} slots)"
            )
        return batch

    def _schedule_prefill(self) -> Batch | None:
        budget = self.cfg.chunked_prefill_size
        picked: list[tuple[Request, int]] = []
        chunking = [r for r in self.running if not r.prefill_done and not r.jumped]
        for req in chunking:  # at most one, by construction
            n = min(req.num_known - req.kv_len, budget)
            if not self.kv.grow(req, n):
                break
            picked.append((req, n))
            budget -= n
        new_reqs: list[Request] = []
        for req, match in self._ordered_waiting():
            if budget <= 0 or len(self.running) + len(new_reqs) >= self.cfg.max_running_requests:
                break
            if self.cache is not None and (match is None or picked):
                # Match (again) right before admitting: an earlier admission in this
                # step may have evicted the node an ordering-time match points to.
                match = self._match(req)
            matched = match.length if match else 0
            if self._shares_with_picked(req, matched, picked):
                continue
            n = min(req.num_known - matched, budget)
            if not self._admit(req, match, n, alone=not (self.running or new_reqs)):
                break
            new_reqs.append(req)
            picked.append((req, n))
            budget -= n
        for req in new_reqs:
            self.waiting.remove(req)
            self.running.append(req)
        if not picked:
            return None
        return self._build_prefill(picked)

    def _ordered_waiting(self) -> list[tuple[Request, Any]]:
        if self.cache is None:
            return [(r, None) for r in self.waiting]
        if len(self.waiting) > self.cfg.lpm_max_queue:
            return [(r, None) for r in self.waiting]  # matched at admission instead
        matched = [(r, self._match(r)) for r in self.waiting]
        matched.sort(key=lambda rm: (-rm[1].length, rm[0].arrival))
        return matched

    def _match_limit(self, req: Request) -> int:
        # At least one token must be computed to get logits; prompt logprobs
        # from position s need the logits of position s-1.
        limit = req.num_known - 1
        if req.params.prompt_logprobs:
            limit = min(limit, max(req.params.prompt_logprobs_start - 1, 0))
        return max(limit, 0)

    def _match(self, req: Request) -> Any:
        assert self.cache is not None
        return self.cache.match_prefix(req.all_ids[: self._match_limit(req)], req.extra_key)

    def _shares_with_picked(self, req: Request, matched: int, picked: list[tuple[Request, int]]) -> bool:
        need = self.cfg.defer_shared_min
        if self.cache is None or req.num_known - matched < need:
            return False
        mine = np.asarray(req.known_ids(matched, matched + need))
        for other, _n in picked:
            if other.extra_key != req.extra_key or other.num_known < matched + need:
                continue
            theirs = np.asarray(other.known_ids(matched, matched + need))
            if np.array_equal(mine, theirs):
                return True
        return False

    def _decode_reserve(self, extra: tuple[Request, ...] = ()) -> int:
        ratio = self.cfg.decode_reserve_ratio
        return sum(math.ceil(r.remaining_tokens * ratio) for r in [*self.running, *extra])

    def _admit(self, req: Request, match: Any, n: int, alone: bool = False) -> bool:
        """Lock the request's cached prefix (`match`) and allocate its first `n` tokens.

        Alone (nothing else running) it needs no decode reserve: it may use the whole pool."""
        reserve = 0 if alone else self._decode_reserve((req,))
        if not self.kv.claim(req, match, n, reserve=reserve):
            return False
        req.status = Status.RUNNING
        req.penalty_init = req.params.uses_penalties
        if not req.admitted:
            req.admitted = True
            req.cached_tokens = min(req.kv_len, len(req.prompt_ids))
            self.prompt_tokens_admitted += len(req.prompt_ids)
            self.cached_tokens_admitted += req.cached_tokens
        return True

    def _schedule_decode(self, inflight: bool) -> Batch | object | None:
        reqs = [
            r
            for r in self.running
            if r.prefill_done and r.kv_len == r.num_tokens - 1 and r.remaining_tokens > 0
        ]
        jumps = [r for r in self.running if r.jumped]  # forced tokens to extend (jump-forward)
        if not reqs and not jumps:
            return None
        while len(reqs) + sum(r.num_known - r.kv_len for r in jumps) > self.kv.available():
            if inflight:
                return NEED_SYNC
            if len(reqs) + len(jumps) == 1:
                req = (reqs or jumps)[0]
                self._finish(req, "abort", error="the KV cache is too small for this request's context")
                return None
            victim = min(reqs + jumps, key=lambda r: (r.num_tokens, -r.arrival))
            (reqs if victim in reqs else jumps).remove(victim)
            self._retract(victim)
        if jumps:
            return self._build_mixed(reqs, jumps)
        slots = self.kv.alloc(len(reqs))
        assert slots is not None
        return self._build_decode(reqs, slots.numpy())

    def _build_decode(self, reqs: list[Request], slots: np.ndarray) -> Batch:
        """One token per request: the hot case, built without per-token work."""
        kv = [r.kv_len for r in reqs]
        # One slot per request, written into the host table in one scatter.
        self.kv.slots[[r.row for r in reqs], kv] = slots
        # The input is the last known token, or -1 when it is still being sampled.
        input_ids = [
            (r.output_ids[-1] if r.output_ids else r.prompt_ids[-1]) if k < r.num_known else -1
            for r, k in zip(reqs, kv)
        ]
        batch = Batch(
            reqs=reqs,
            extend_lens=[1] * len(reqs),
            prefix_lens=kv,
            input_ids=input_ids,
            out_slots=slots.astype(np.int64),
            kv_indices=np.concatenate([self.kv.slots[r.row, : k + 1] for r, k in zip(reqs, kv)]),
            sample=[True] * len(reqs),
            sampling=self._sampling_inputs(reqs),
            is_prefill=False,
        )
        if self.grouper is not None:  # shared-prefix groups for cascade attention
            batch.cascade = self.grouper.group([r.lock_node for r in reqs])
        self._advance([(r, 1) for r in reqs], batch.sample)
        return batch

    def _build_mixed(self, reqs: list[Request], jumps: list[Request]) -> Batch:
        """Decode rows plus the forced tokens of jump-forward requests, in one extend step."""
        picked = [(r, 1) for r in reqs] + [(r, r.num_known - r.kv_len) for r in jumps]
        for r, n in picked:
            grown = self.kv.grow(r, n)
            assert grown
        for r in jumps:
            r.jumped = False
        return self._build_prefill(picked, cache_prefix=False)

    def _sampling_inputs(self, reqs: list[Request]) -> SamplingInputs:
        return SamplingInputs.from_requests(
            rows=[r.row for r in reqs],
            params=[r.params for r in reqs],
            num_outputs=[len(r.output_ids) + r.pending for r in reqs],
            eos_ids=[r.eos_ids for r in reqs],
            penalty_init=[(r.row, r.all_ids) for r in reqs if r.penalty_init],
        )

    def _advance(self, picked: list[tuple[Request, int]], sample: list[bool]) -> None:
        """The batch is built: its tokens now count as computed (or in flight)."""
        for (req, n), s in zip(picked, sample):
            req.kv_len += n
            req.pending += int(s)
            if s:
                req.penalty_init = False

    def _build_prefill(self, picked: list[tuple[Request, int]], cache_prefix: bool = True) -> Batch:
        input_ids: list[int] = []
        lp_rows: list[list[int]] = []
        lp_targets: list[int] = []
        sample: list[bool] = []
        prefix_lens, extend_lens, ctx, out = [], [], [], []
        for req, n in picked:
            start = req.kv_len
            if start + n <= req.num_known:
                input_ids.extend(req.known_ids(start, start + n))
            else:  # decode of a token still in flight
                input_ids.append(-1)
            rows: list[int] = []
            if req.params.prompt_logprobs:
                first = max(req.params.prompt_logprobs_start, 1)
                for p in range(max(first, start + 1), min(start + n, len(req.prompt_ids) - 1) + 1):
                    rows.append(len(input_ids) - n + (p - 1 - start))
                    lp_targets.append(req.prompt_ids[p])
            lp_rows.append(rows)
            prefix_lens.append(start)
            extend_lens.append(n)
            row_slots = self.kv.slots[req.row]
            ctx.append(row_slots[: start + n])
            out.append(row_slots[start : start + n])
            sample.append(
                start + n >= req.num_tokens and req.params.max_tokens > 0 and req.remaining_tokens > 0
            )
        batch = Batch(
            reqs=[r for r, _ in picked],
            extend_lens=extend_lens,
            prefix_lens=prefix_lens,
            input_ids=input_ids,
            out_slots=np.concatenate(out).astype(np.int64),
            kv_indices=np.concatenate(ctx),
            sample=sample,
            sampling=self._sampling_inputs([r for (r, _), s in zip(picked, sample) if s]),
            prompt_lp_rows=lp_rows,
            prompt_lp_targets=lp_targets,
            is_prefill=True,
        )
        self._advance(picked, sample)
        if self.cache is not None and cache_prefix:
            # Prompt KV goes into the tree as soon as it is scheduled (stream order
            # makes later readers see it computed), so requests sharing the prefix
            # hit it while this one is still decoding.
            for req, _ in picked:
                self.kv.cache_prefix(req)
        return batch

    def _retract(self, req: Request) -> None:
        self.kv.release(req)
        self.running.remove(req)
        req.status = Status.WAITING
        req.jumped = False  # its forced tokens are prefilled with the rest on readmission
        self.retractions += 1
        self.waiting.appendleft(req)

    def _finish(
        self, req: Request, reason: str, stop_reason: str | int | None = None, error: str | None = None
    ) -> None:
        req.status = Status.FINISHED
        req.finish_reason, req.stop_reason, req.error = reason, stop_reason, error
        if req in self.running:
            self.kv.release(req)
            self.running.remove(req)
        if reason == "abort":
            self._aborted.append(make_output(req, [], None, final=True))

    # ---- after a step --------------------------------------------------------------------

    def process(self, batch: Batch, result: StepResult) -> list[RequestOutput]:
        outputs = self.take_aborted()
        j = 0
        lp_j = 0
        for i, req in enumerate(batch.reqs):
            n_lp = len(batch.prompt_lp_rows[i]) if batch.prompt_lp_rows else 0
            if n_lp and result.prompt_lps is not None:
                for k in range(lp_j, lp_j + n_lp):
                    lp_val, top = result.prompt_lps[k]
                    top_n = tuple(top[: req.params.top_logprobs])
                    req.prompt_logprobs.append(TokenLogprob(batch.prompt_lp_targets[k], lp_val, top_n))
            lp_j += n_lp
            if not batch.sample[i]:
                if not req.finished and req.prefill_done and req.params.max_tokens == 0:
                    self._finish(req, "length")
                    outputs.append(make_output(req, [], None, final=True))
                continue
            tok = result.next_ids[j]
            lp = None
            if result.logprobs is not None and req.params.logprobs:
                top_j = tuple(result.top[j][: req.params.top_logprobs]) if result.top else ()
                lp = TokenLogprob(tok, result.logprobs[j], top_j)
            j += 1
            if req.finished:
                continue  # aborted or stopped while this step was in flight
            if req.discard:  # sampled before a jump-forward replaced it (sched/grammar.py)
                req.discard -= 1
                continue
            req.pending -= 1
            if tok < 0:  # INVALID_TOKEN: this row's logits were NaN/inf
                self._finish(req, "abort", error="the model produced non-finite logits (NaN/inf)")
                continue
            req.output_ids.append(tok)
            try:
                out = self._on_token(req, tok, lp)
            except Exception as e:  # noqa: BLE001 - one request's data (its detokenization) fails it alone
                self.fail_request(req, e)
                continue
            if out is not None:
                outputs.append(out)
        outputs.extend(self.take_aborted())
        return outputs

    def fail_request(self, req: Request, err: BaseException) -> None:
        """End one request with finish_reason "abort" because handling its data raised `err`."""
        req.detok = None  # it may be what failed: the abort output carries no text
        self._finish(req, "abort", error=f"this request failed: {type(err).__name__}: {err}")

    def _on_token(self, req: Request, tok: int, lp: TokenLogprob | None) -> RequestOutput | None:
        if req.detok is not None:
            req.detok.add([tok])
        reason, stop_reason = stop_rule(req, tok)
        new = [tok]
        if reason is None and req.grammar is not None:
            reason, stop_reason, new = self._grammar_step(req, tok)
        if reason == "abort":
            return None  # its output is in self._aborted
        if reason is not None:
            self._finish(req, reason, stop_reason)
            return make_output(req, new, lp, final=True)
        if not req.stream:  # complete(): nobody reads the steps in between
            if lp is not None:
                req.logprobs.append(lp)
            return None
        return make_output(req, new, lp, final=False)

    def _grammar_step(self, req: Request, tok: int) -> tuple[str | None, str | int | None, list[int]]:
        """Accept `tok`, then append what the grammar forces (jump-forward), with stop rules."""
        reason, stop_reason, error = grammar.accept(req, tok)
        if reason == "abort":
            self._finish(req, "abort", error=error)
        if reason is not None:
            return reason, stop_reason, [tok]
        forced = grammar.jump_forward(req, self.tokenizer)
        new = [tok]
        for f in forced:
            req.output_ids.append(f)
            new.append(f)
            self.jump_forward_tokens += 1
            if req.detok is not None:
                req.detok.add([f])
            reason, stop_reason = stop_rule(req, f)
            if reason is not None:
                return reason, stop_reason, new
        if forced and req.discard:
            self.jump_discarded += 1
        return None, None, new

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running)
