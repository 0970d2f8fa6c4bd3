"""Radix-cache lookups for admission: the order in which waiting requests are tried, and
whether a request should wait a step for a prefix another pick is computing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.tree_node import MatchResult
from radixserve.sched.request import Request


def match_limit(req: Request) -> int:
    """How much of the request may come from the cache."""
    # At least one token must be computed to get logits; prompt logprobs
    # from position s need the logits of position s-1.
    limit = req.num_known - 1
    if req.params.prompt_logprobs:
        limit = min(limit, max(req.params.prompt_logprobs_start - 1, 0))
    return max(limit, 0)


def match(cache: RadixCache, req: Request) -> MatchResult:
    return cache.match_prefix(req.all_ids[: match_limit(req)], req.extra_key)


def ordered_waiting(
    cache: RadixCache | None, waiting: Iterable[Request], lpm_max_queue: int
) -> Sequence[tuple[Request, MatchResult | None]]:
    """Longest cached prefix first (with its match); FCFS (no match) without a cache or
    beyond `lpm_max_queue` requests, since ordering costs a tree match per request."""
    reqs = list(waiting)
    if cache is None or len(reqs) > lpm_max_queue:
        return [(r, None) for r in reqs]  # matched at admission instead
    matched = [(r, match(cache, r)) for r in reqs]
    matched.sort(key=lambda rm: (-rm[1].length, rm[0].arrival))
    return matched


def shares_with_picked(req: Request, matched: int, picked: list[tuple[Request, int]], need: int) -> bool:
    """Whether `req`'s next `need` uncached tokens are also those of a request picked this step."""
    if req.num_known - matched < need:
        return False
    mine = np.asarray(req.known_ids(matched, matched + need))
    for other, _n in picked:
        if other.extra_key != req.extra_key or other.num_known < matched + need:
            continue
        theirs = np.asarray(other.known_ids(matched, matched + need))
        if np.array_equal(mine, theirs):
            return True
    return False
