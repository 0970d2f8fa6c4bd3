"""`Admission`: the waiting queue and the prompt tokens each step takes (policy: sched/scheduler.py).

- `budget_beside_decode`: beside decode rows a step takes at most
  `mixed_prefill_tokens` prompt tokens, so the decoders' time between tokens
  stays short while prompts arrive, unless more than a chunk of prompt tokens
  waits (a burst: those requests already wait, and small steps would add to it).
- `pick`: the chunked prompt in progress first, then waiting requests in
  prefix-match order, each admitted if its tokens and the running requests'
  decode reserve fit (`_admit`); admitted requests join the `RunningSet`.
  A step scores at most `prompt_logprob_rows` prompt positions (prompt
  logprobs): a chunk that would score more is cut, and it is the step's last.
"""

from __future__ import annotations

import itertools
from collections import deque

from radixserve.cache.radix_tree import MatchResult, RadixCache
from radixserve.sched import prefix_match
from radixserve.sched.config import SchedulerConfig
from radixserve.sched.request import Request, Status
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.running import RunningSet


class Admission:
    def __init__(
        self, cfg: SchedulerConfig, cache: RadixCache | None, kv: RequestKV, running: RunningSet
    ) -> None:
        self.cfg = cfg
        self.cache = cache
        self.kv = kv
        self.running = running
        self.waiting: deque[Request] = deque()
        self.prompt_tokens_admitted = 0
        self.cached_tokens_admitted = 0

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def requeue(self, req: Request) -> None:
        """A retracted request goes first: it already waited."""
        self.waiting.appendleft(req)

    def remove(self, rid: str) -> list[Request]:
        """Take every waiting completion of request `rid` off the queue."""
        gone = [r for r in self.waiting if r.rid == rid]
        for req in gone:
            self.waiting.remove(req)
        return gone

    def pop_oldest(self) -> Request:
        return self.waiting.popleft()

    def budget_beside_decode(self, budget: int) -> int:
        """The prefill budget of a step that also decodes."""
        cap = self.cfg.mixed_prefill_tokens
        if budget <= cap or (not self.waiting and self.running.steady.active):
            return budget  # nothing to cap, or no prompt waits (a steady set has none chunking)
        return budget if self._backlog_exceeds(self.cfg.chunked_prefill_size) else cap

    def _backlog_exceeds(self, tokens: int) -> bool:
        """Whether more than `tokens` prompt tokens wait to be prefilled (cached or not)."""
        left = tokens
        for req in itertools.chain((r for r in self.running.reqs if r.chunking), self.waiting):
            left -= req.num_known - req.kv_len
            if left < 0:
                return True
        return False

    def pick(self, budget: int) -> list[tuple[Request, int]]:
        """Up to `budget` prompt tokens: the chunked prompt in progress, then admissions."""
        picked: list[tuple[Request, int]] = []
        if budget <= 0:
            return picked
        cfg, cache, running = self.cfg, self.cache, self.running
        # Prompt positions the step may score (each a float32 logits row over the vocabulary):
        # a request asking prompt logprobs of a long prompt takes more, smaller chunks instead
        # of running the device out of memory.
        lp_rows = cfg.prompt_logprob_rows
        # A steady decode set holds every running request but those at their length limit.
        chunking = [] if running.steady.active else [r for r in running.reqs if r.chunking]
        for req in chunking:  # at most one, by construction
            whole = min(req.num_known - req.kv_len, budget)
            n = req.chunk_scoring_at_most(req.kv_len, whole, lp_rows)
            if not self.kv.grow(req, n):
                break
            picked.append((req, n))
            lp_rows -= len(req.scored_positions(req.kv_len, n))
            budget = budget - n if n == whole else 0  # cut by the rows it scores: still chunking
        new_reqs: list[Request] = []
        if budget <= 0 or len(running) >= cfg.max_running_requests or not self.waiting:
            return picked  # no admission: spare the queue's tree matches
        # Slots kept free for decoding: the running requests', then also each admitted one's
        # (it runs from this step on). The first request admitted alone needs none.
        reserve = running.decode_reserve() if running.reqs else 0
        if running.reqs and 1 + reserve > self.kv.available():
            # Not even one token of any request fits beside the decode reserve (locking a
            # match only lowers what is available): the pool is full, skip the matches.
            return picked
        for req, match in prefix_match.ordered_waiting(cache, self.waiting, cfg.lpm_max_queue):
            if budget <= 0 or len(running) + len(new_reqs) >= cfg.max_running_requests:
                break
            if cache is not None and (match is None or picked):
                # Match (again) right before admitting: an earlier admission in this
                # step may have evicted the node an ordering-time match points to.
                match = prefix_match.match(cache, req)
            matched = match.length if match else 0
            if cache is not None and prefix_match.shares_with_picked(
                req, matched, picked, cfg.defer_shared_min
            ):
                continue
            n = min(req.num_known - matched, budget)
            whole = n
            n = req.chunk_scoring_at_most(matched, n, lp_rows)
            own = running.reserve_of(req)
            alone = not (running.reqs or new_reqs)
            if n <= 0 or not self._admit(req, match, n, 0 if alone else reserve + own):
                break
            reserve += own
            new_reqs.append(req)
            picked.append((req, n))
            lp_rows -= len(req.scored_positions(matched, n))
            budget = budget - n if n == whole else 0  # one cut prompt per step, the last
        for req in new_reqs:
            self.waiting.remove(req)
            running.add(req)
        return picked

    def _admit(self, req: Request, match: MatchResult | None, n: int, reserve: int) -> bool:
        """Lock the request's cached prefix (`match`) and allocate its first `n` tokens, keeping
        `reserve` slots free beside them."""
        if not self.kv.claim(req, match, n, reserve=reserve):
            return False
        req.status = Status.RUNNING
        self.running.sampling_rows.bind(req)
        if not req.admitted:
            req.admitted = True
            req.cached_tokens = min(req.kv_len, len(req.prompt_ids))
            self.prompt_tokens_admitted += len(req.prompt_ids)
            self.cached_tokens_admitted += req.cached_tokens
        return True
