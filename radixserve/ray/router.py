"""`PrefixAffinityRouter`: Ray Serve's request-router API with radixserve's cache-aware rule.

It runs where the handle to the engine replicas lives (the ingress) and keeps,
per replica, the same `PrefixIndex` as the in-process router: a prompt's token
ids go in when a request is routed to a replica (pending) and are confirmed
when it completes there. `cache_aware_choice` picks the replica (the longest
prefix above `cache_threshold`, unless its load exceeds the least loaded one's
by `balance_abs` and `balance_rel`; else the least loaded); the other replicas
follow in order of load, so Ray Serve falls back to them when the chosen one
is full (`max_ongoing_requests`). Load is the requests this router has in
flight on each replica; each index is bounded by its replica's KV pool
(`record_replica_metadata`). Ray only tells a router that a request ended,
not what it found cached, so the cached-count feedback of the in-process
router is not available here: capacity alone keeps the index honest.

Other calls (the ingress's `info`) go to the least loaded replica; maintenance
reaches every replica by the handle's `broadcast`, which no router sees.
Decisions are counted (`decisions`) and exported as the Ray metric
`radixserve_router_decisions{decision}`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ray.serve._private.common import ReplicaID
from ray.serve._private.replica_result import ReplicaResult
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from ray.util.metrics import Counter

from radixserve.config import RouterConfig
from radixserve.replicas.prefix_index import PrefixIndex
from radixserve.replicas.router import Decision, cache_aware_choice

ROUTED_METHODS = ("generate", "complete")
_DEFAULT_INDEX_TOKENS = 1 << 20  # until a replica reports its KV pool
_MAX_CHOICES = 4096


@dataclass(frozen=True)
class _Routed:
    ids: list[int]
    namespace: str | None
    decision: Decision


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, **router_config: object) -> None:
        """`router_config`: `RouterConfig`'s fields (`request_router_kwargs` of the deployment)."""
        self.cfg = RouterConfig(**router_config)  # type: ignore[arg-type]  # checked by RouterConfig
        self._indexes: dict[ReplicaID, PrefixIndex] = {}
        self._load: dict[ReplicaID, int] = {}
        # A choice waits here for its request to be routed, by the PendingRequest's identity:
        # calls made while serving one HTTP request share its internal request id.
        self._choices: dict[int, _Routed] = {}
        # Routed, until completed: (replica, internal request id) -> prompts, oldest first.
        self._routed: dict[tuple[ReplicaID, str], list[_Routed]] = {}
        self.decisions = dict.fromkeys(Decision, 0)
        self._metric = Counter(
            "radixserve_router_decisions", "Requests routed, by the router's reason", tag_keys=("decision",)
        )

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id: r for r in replicas}
        for gone in set(self._indexes) - set(live):
            del self._indexes[gone]
        for rid, replica in live.items():
            if rid not in self._indexes:
                kv = replica.replica_metadata.get("kv_tokens", _DEFAULT_INDEX_TOKENS)
                self._indexes[rid] = PrefixIndex(self.cfg.index_tokens or int(kv))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._indexes.pop(replica_id, None)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_load = sorted(candidate_replicas, key=lambda r: self._load.get(r.replica_id, 0))
        if (
            not candidate_replicas
            or pending_request is None
            or pending_request.metadata.call_method not in ROUTED_METHODS
        ):
            return [by_load] if by_load else []
        ids: list[int] = pending_request.kwargs["ids"]
        namespace: str | None = pending_request.kwargs.get("extra_key")
        up = [r.replica_id for r in candidate_replicas]
        indexes = {rid: self._index(rid) for rid in up}
        matched = {rid: indexes[rid].match(ids, namespace).length for rid in up}
        load = {rid: self._load.get(rid, 0) for rid in up}
        sizes = {rid: indexes[rid].size for rid in up}
        chosen, decision = cache_aware_choice(self.cfg, up, matched, load, sizes, len(ids))
        self._choices[id(pending_request)] = _Routed(ids, namespace, decision)
        if len(self._choices) > _MAX_CHOICES:  # choices of requests cancelled before routing
            del self._choices[next(iter(self._choices))]
        first = [r for r in candidate_replicas if r.replica_id == chosen]
        return [first, [r for r in by_load if r.replica_id != chosen]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        self._load[replica_id] = self._load.get(replica_id, 0) + 1
        routed = self._choices.pop(id(pending_request), None)
        if routed is None:
            return
        self.decisions[routed.decision] += 1
        self._metric.inc(tags={"decision": routed.decision.value})
        self._index(replica_id).insert(routed.ids, routed.namespace)  # pending until it completes
        key = (replica_id, pending_request.metadata.internal_request_id)
        self._routed.setdefault(key, []).append(routed)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._load[replica_id] = max(0, self._load.get(replica_id, 0) - 1)
        key = (replica_id, internal_request_id)
        waiting = self._routed.get(key)
        if not waiting:
            return
        routed = waiting.pop(0)
        if not waiting:
            del self._routed[key]
        if replica_id in self._indexes:
            self._indexes[replica_id].insert(routed.ids, routed.namespace, confirmed=True)

    def _index(self, replica_id: ReplicaID) -> PrefixIndex:
        index = self._indexes.get(replica_id)
        if index is None:  # a replica not yet announced by update_replicas
            index = self._indexes[replica_id] = PrefixIndex(self.cfg.index_tokens or _DEFAULT_INDEX_TOKENS)
        return index
