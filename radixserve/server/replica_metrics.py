"""Prometheus figures of an engine of replicas: the router's decisions and each replica's state.

Read from the engine's last `stats()` (taken when `/metrics` is scraped, see
`ServerMetrics.render`); an engine without replicas has none of these keys and
exports nothing here. Counters are the engine's own counts, exposed as they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

DECISIONS = ("prefix", "balanced", "least_loaded", "round_robin")


class ReplicaCollector(Collector):
    def __init__(self) -> None:
        self._stats: Mapping[str, int | float] = {}

    def update(self, stats: Mapping[str, int | float]) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []  # names only known once an engine of replicas reports them

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        if "router_decisions_prefix" in s:  # the in-process router's (radixserve.ray's are Ray metrics)
            yield from self._router(s)
        if "replica0_healthy" in s:
            yield from self._replicas(s)

    def _router(self, s: Mapping[str, int | float]) -> Iterator[Metric]:
        decisions = CounterMetricFamily(
            "radixserve_router_decisions", "Requests routed, by the router's reason", labels=["decision"]
        )
        for d in DECISIONS:
            decisions.add_metric([d], s[f"router_decisions_{d}"])
        yield decisions
        yield CounterMetricFamily(
            "radixserve_router_predicted_tokens",
            "Prompt tokens the router expected in the chosen replica's cache",
            value=s["router_predicted_tokens"],
        )
        yield GaugeMetricFamily(
            "radixserve_router_index_tokens",
            "Tokens the router's prefix index holds (all replicas)",
            value=s["router_index_tokens"],
        )

    def _replicas(self, s: Mapping[str, int | float]) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "radixserve_replica_healthy", "1 while the replica serves", labels=["replica"]
        )
        in_flight = GaugeMetricFamily(
            "radixserve_replica_requests_in_flight", "Requests routed and not finished", labels=["replica"]
        )
        routed = CounterMetricFamily("radixserve_replica_routed", "Requests routed", labels=["replica"])
        for i in range(int(s["replicas"])):
            healthy.add_metric([str(i)], s[f"replica{i}_healthy"])
            in_flight.add_metric([str(i)], s[f"replica{i}_in_flight"])
            routed.add_metric([str(i)], s[f"replica{i}_routed"])
        yield from (healthy, in_flight, routed)
