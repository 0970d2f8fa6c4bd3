"""Prefill admission: which prompt tokens a step takes (`Scheduler`'s policy, module doc there).

- `mixed_budget`: beside decode rows a step takes at most `mixed_prefill_tokens`
  prompt tokens, so the decoders' time between tokens stays short while
  prompts arrive, unless more than a chunk of prompt tokens waits (a burst:
  those requests already wait, and small steps would add to it).
- `pick_prefill`: the chunked prompt in progress first, then waiting requests
  in prefix-match order, each admitted if its tokens and the running requests'
  decode reserve fit (`admit`).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from radixserve.sched import prefix_match
from radixserve.sched.request import Request, Status

if TYPE_CHECKING:
    from radixserve.sched.scheduler import Scheduler


def mixed_budget(sched: Scheduler, budget: int) -> int:
    """The prefill budget of a step that also decodes."""
    cap = sched.cfg.mixed_prefill_tokens
    if budget <= cap or (not sched.waiting and sched.steady.active):
        return budget  # nothing to cap, or no prompt waits (a steady set has none chunking)
    return budget if backlog_exceeds(sched, sched.cfg.chunked_prefill_size) else cap


def backlog_exceeds(sched: Scheduler, tokens: int) -> bool:
    """Whether more than `tokens` prompt tokens wait to be prefilled (cached or not)."""
    left = tokens
    for req in itertools.chain((r for r in sched.running if r.chunking), sched.waiting):
        left -= req.num_known - req.kv_len
        if left < 0:
            return True
    return False


def pick_prefill(sched: Scheduler, budget: int) -> list[tuple[Request, int]]:
    """Up to `budget` prompt tokens: the chunked prompt in progress, then admissions."""
    picked: list[tuple[Request, int]] = []
    if budget <= 0:
        return picked
    cfg, cache = sched.cfg, sched.cache
    # A steady decode set holds every running request but those at their length limit.
    chunking = [] if sched.steady.active else [r for r in sched.running if r.chunking]
    for req in chunking:  # at most one, by construction
        n = min(req.num_known - req.kv_len, budget)
        if not sched.kv.grow(req, n):
            break
        picked.append((req, n))
        budget -= n
    new_reqs: list[Request] = []
    if budget <= 0 or len(sched.running) >= cfg.max_running_requests or not sched.waiting:
        return picked  # no admission: spare the queue's tree matches
    if sched.running and 1 + decode_reserve(sched) > sched.kv.available():
        # Not even one token of any request fits beside the decode reserve (locking a
        # match only lowers what is available): the pool is full, skip the matches.
        return picked
    for req, match in prefix_match.ordered_waiting(cache, sched.waiting, cfg.lpm_max_queue):
        if budget <= 0 or len(sched.running) + len(new_reqs) >= cfg.max_running_requests:
            break
        if cache is not None and (match is None or picked):
            # Match (again) right before admitting: an earlier admission in this
            # step may have evicted the node an ordering-time match points to.
            match = prefix_match.match(cache, req)
        matched = match.length if match else 0
        if cache is not None and prefix_match.shares_with_picked(req, matched, picked, cfg.defer_shared_min):
            continue
        n = min(req.num_known - matched, budget)
        if not admit(sched, req, match, n, alone=not (sched.running or new_reqs)):
            break
        new_reqs.append(req)
        picked.append((req, n))
        budget -= n
    for req in new_reqs:
        sched.waiting.remove(req)
        sched.running.append(req)
    return picked


def decode_reserve(sched: Scheduler, extra: tuple[Request, ...] = ()) -> int:
    """KV slots kept free for the running requests' (and `extra`'s) decoding."""
    ratio = sched.cfg.decode_reserve_ratio
    if sched.steady.active:  # every running request is in the set (or has no tokens left)
        return sched.steady.reserve(ratio) + sum(math.ceil(r.remaining_tokens * ratio) for r in extra)
    return sum(math.ceil(r.remaining_tokens * ratio) for r in [*sched.running, *extra])


def admit(sched: Scheduler, req: Request, match: Any, n: int, alone: bool = False) -> bool:
    """Lock the request's cached prefix (`match`) and allocate its first `n` tokens.

    Alone (nothing else running) it needs no decode reserve: it may use the whole pool."""
    reserve = 0 if alone else decode_reserve(sched, (req,))
    if not sched.kv.claim(req, match, n, reserve=reserve):
        return False
    req.status = Status.RUNNING
    sched.sampling_rows.bind(req)
    if not req.admitted:
        req.admitted = True
        req.cached_tokens = min(req.kv_len, len(req.prompt_ids))
        sched.prompt_tokens_admitted += len(req.prompt_ids)
        sched.cached_tokens_admitted += req.cached_tokens
    return True
