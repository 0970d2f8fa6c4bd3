"""`Router`: which replica serves a request, and the books it keeps to decide.

Cache-aware (SGLang's router's policy, on the router's own guess of each
replica's radix cache, `PrefixIndex`): a request goes to the replica whose
index holds the longest prefix of its prompt when that prefix covers at least
`cache_threshold` of it, unless that replica's load exceeds the least loaded
one's by both `balance_abs` requests and a factor `balance_rel`; otherwise
(no useful prefix, or too much load there) to the least loaded replica, the
one with the smallest index among equals (most room for a new prefix).

Load is what the router itself counts: completions sent to a replica and not
yet finished (its waiting plus running requests), so routing needs no call
into the replicas' worker threads. A failed replica takes no more requests and
its index is forgotten. Every decision is counted (`RouterStats`).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from radixserve.config import RouterConfig
from radixserve.errors import EngineDeadError
from radixserve.replicas.prefix_index import NO_MATCH, PrefixIndex, PrefixMatch


class Decision(str, enum.Enum):
    PREFIX = "prefix"  # the replica holding the longest prefix
    BALANCED = "balanced"  # that replica was too loaded: the least loaded instead
    LEAST_LOADED = "least_loaded"  # no prefix worth following
    ROUND_ROBIN = "round_robin"


@dataclass(frozen=True)
class Placement:
    """Where one request went and what the router expected there (for `Router.finished`)."""

    replica: int
    decision: Decision
    weight: int  # completions (n) counted in the replica's load
    namespace: str | None  # the request's extra_key: the radix cache's namespace
    prompt_len: int
    found: PrefixMatch  # the replica's index's match when routed


@dataclass(frozen=True)
class RouterStats:
    decisions_prefix: int
    decisions_balanced: int
    decisions_least_loaded: int
    decisions_round_robin: int
    predicted_tokens: int  # prompt tokens the chosen replicas' indexes held when routed
    index_tokens: int  # tokens the indexes hold now (all replicas)
    index_evicted_tokens: int  # dropped to stay within each replica's capacity
    index_forgotten_tokens: int  # dropped on eviction feedback (a replica served fewer cached tokens)

    def as_dict(self) -> dict[str, int]:
        return {f"router_{k}": v for k, v in asdict(self).items()}


K = TypeVar("K", bound=Hashable)


def cache_aware_choice(
    cfg: RouterConfig,
    up: Sequence[K],
    matched: Mapping[K, int],
    load: Mapping[K, int],
    size: Mapping[K, int],
    prompt_len: int,
) -> tuple[K, Decision]:
    """The cache-aware rule over live replicas `up` (any keys: indexes here, Ray's replica ids in
    radixserve.ray): `matched` prompt tokens in each one's index, its `load`, its index's `size`."""
    best = max(up, key=lambda k: (matched[k], -load[k]))  # equals: the less loaded
    least = min(up, key=lambda k: (load[k], size[k]))  # equals: the most room for a new prefix
    m = matched[best]
    if m == 0 or m < cfg.cache_threshold * prompt_len:
        return least, Decision.LEAST_LOADED
    gap = load[best] - load[least]
    if gap > cfg.balance_abs and load[best] > cfg.balance_rel * load[least]:
        return least, Decision.BALANCED
    return best, Decision.PREFIX


class Router:
    def __init__(self, cfg: RouterConfig, capacities: Sequence[int], page_size: int = 1) -> None:
        """`capacities`: each replica's KV pool in tokens (the bound of its index)."""
        if not capacities:
            raise ValueError("a router needs at least one replica")
        self.cfg = cfg
        self.page_size = page_size
        n = len(capacities)
        self.load = [0] * n  # completions in flight per replica
        self.routed = [0] * n  # requests sent per replica, ever
        self._indexes: list[PrefixIndex] | None = None
        if cfg.policy == "cache_aware":
            self._indexes = [PrefixIndex(cfg.index_tokens or c) for c in capacities]
        self._turn = 0
        self._decisions = dict.fromkeys(Decision, 0)
        self._predicted = 0

    def route(
        self, ids: Sequence[int], namespace: str | None, weight: int, live: Sequence[bool]
    ) -> Placement:
        """The replica for a prompt of `ids` with `weight` completions, among the `live` ones."""
        up = [i for i, ok in enumerate(live) if ok]
        if not up:
            raise EngineDeadError("every replica of this engine has failed")
        found = NO_MATCH
        if self.cfg.policy == "round_robin":
            replica, decision = self._next_in_turn(live), Decision.ROUND_ROBIN
        elif self._indexes is None:
            replica, decision = self._least_loaded(up), Decision.LEAST_LOADED
        else:
            finds = {i: self._indexes[i].match(ids, namespace) for i in up}
            replica, decision = self._cache_aware(up, finds, len(ids))
            found = finds[replica]
            self._indexes[replica].insert(ids, namespace)  # pending until it finishes there
        self.load[replica] += weight
        self.routed[replica] += 1
        self._decisions[decision] += 1
        self._predicted += found.length
        return Placement(replica, decision, weight, namespace, len(ids), found)

    def finished(self, p: Placement, tokens: Sequence[int] | None, cached: int | None) -> None:
        """Request `p` ended. `tokens` (prompt and output whose KV the replica cached) and
        `cached` (its `Usage.cached_tokens`) when it finished normally; None when it was
        aborted or failed, or when its cached count says nothing of the cache (prompt logprobs)."""
        self.load[p.replica] -= p.weight
        if self._indexes is None or tokens is None:
            return
        index = self._indexes[p.replica]
        if cached is not None:
            # The replica always computes a prompt's last token, and matches whole pages.
            promised = min(p.found.confirmed, p.prompt_len - 1)
            if cached + self.page_size <= promised:
                index.forget_evicted(p.found, cached)
        index.insert(tokens, p.namespace, confirmed=True)

    def forget(self, replica: int) -> None:
        """The replica's cache is empty (flushed) or gone (failed)."""
        if self._indexes is not None:
            self._indexes[replica].clear()

    def stats(self) -> RouterStats:
        idx = self._indexes or []
        d = self._decisions
        return RouterStats(
            decisions_prefix=d[Decision.PREFIX],
            decisions_balanced=d[Decision.BALANCED],
            decisions_least_loaded=d[Decision.LEAST_LOADED],
            decisions_round_robin=d[Decision.ROUND_ROBIN],
            predicted_tokens=self._predicted,
            index_tokens=sum(i.size for i in idx),
            index_evicted_tokens=sum(i.evicted_tokens for i in idx),
            index_forgotten_tokens=sum(i.forgotten_tokens for i in idx),
        )

    # ---- policies -------------------------------------------------------------------------

    def _cache_aware(self, up: list[int], finds: dict[int, PrefixMatch], n: int) -> tuple[int, Decision]:
        assert self._indexes is not None
        matched = {i: finds[i].length for i in up}
        sizes = {i: self._indexes[i].size for i in up}
        return cache_aware_choice(self.cfg, up, matched, dict(enumerate(self.load)), sizes, n)

    def _least_loaded(self, up: list[int]) -> int:
        sizes = [i.size for i in self._indexes] if self._indexes is not None else None
        return min(up, key=lambda i: (self.load[i], sizes[i] if sizes is not None else 0))

    def _next_in_turn(self, live: Sequence[bool]) -> int:
        n = len(live)
        for step in range(n):
            i = (self._turn + step) % n
            if live[i]:
                self._turn = i + 1
                return i
        raise EngineDeadError("every replica of this engine has failed")
