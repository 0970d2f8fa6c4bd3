"""Prometheus metrics of one app, in a registry of its own (several apps in a process never collide).

Routes wrap each engine request in `metrics.track()`; the returned `Tracker`
sees every output and records time to first token, inter-token latency (per
token, from the gap between outputs), end-to-end latency and the token
counters. Gauges that describe the engine (running / waiting requests, KV
usage, cache hit rate; with replicas, the router's decisions and each replica's
health: `replica_metrics.py`) are read from `engine.stats()` when `/metrics` is scraped.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixserve.outputs import RequestOutput
from radixserve.server.replica_metrics import ReplicaCollector

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge("radixserve_num_requests_running", "Requests in the running batch", registry=r)
        self.waiting = Gauge(
            "radixserve_num_requests_waiting", "Requests waiting to be scheduled", registry=r
        )
        self.kv_usage = Gauge(
            "radixserve_kv_cache_usage_ratio", "Share of KV slots held by requests or the cache", registry=r
        )
        self.hit_rate = Gauge(
            "radixserve_cache_hit_rate", "Prompt tokens read from the radix cache / prompt tokens", registry=r
        )
        self.in_flight = Gauge("radixserve_http_requests_in_flight", "Admitted HTTP completions", registry=r)
        self.prompt_tokens = Counter("radixserve_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("radixserve_generation_tokens", "Tokens generated", registry=r)
        self.cached_tokens = Counter(
            "radixserve_cached_tokens", "Prompt tokens whose KV came from the cache", registry=r
        )
        self.requests = Counter("radixserve_requests", "Finished completions", ["finish_reason"], registry=r)
        self.ttft = Histogram(
            "radixserve_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "radixserve_inter_token_latency_seconds", "Time between tokens", buckets=_ITL, registry=r
        )
        self.e2e = Histogram(
            "radixserve_e2e_request_latency_seconds", "Request latency", buckets=_LATENCY, registry=r
        )
        self.replicas = ReplicaCollector()  # router and replicas (an engine of replicas only)
        r.register(self.replicas)

    def track(self) -> Tracker:
        return Tracker(self)

    async def render(self, engine: Any, in_flight: int) -> bytes:
        """The exposition text, after refreshing the gauges from the engine."""
        if engine.healthy:
            s = await engine.stats()
            self.running.set(s["running"])
            self.waiting.set(s["waiting"])
            total = max(1, s["total_slots"])
            self.kv_usage.set((total - s["free_slots"]) / total)
            self.hit_rate.set(s["prompt_tokens_cached"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0)
            self.replicas.update(s)
        self.in_flight.set(in_flight)
        return generate_latest(self.registry)


class Tracker:
    """Timing of one engine request (all its n completions)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics
        self.start = time.perf_counter()
        self._last: dict[int, float] = {}  # completion index -> time of its last output
        self._first = False
        self._prompt_counted = False

    def observe(self, out: RequestOutput) -> None:
        now = time.perf_counter()
        n_new = len(out.delta_token_ids)
        if n_new:
            if not self._first:
                self._first = True
                self.m.ttft.observe(now - self.start)
            prev = self._last.get(out.index)
            if prev is not None:
                gap = (now - prev) / n_new
                for _ in range(n_new):
                    self.m.itl.observe(gap)
            self._last[out.index] = now
            self.m.generation_tokens.inc(n_new)
        if out.finished:
            if not self._prompt_counted:  # the n completions share one prompt
                self._prompt_counted = True
                self.m.prompt_tokens.inc(out.usage.prompt_tokens)
                self.m.cached_tokens.inc(out.usage.cached_tokens)
            self.m.requests.labels(out.finish_reason or "abort").inc()

    def observe_final(self, outs: list[RequestOutput]) -> None:
        """For non-streamed requests: the final outputs only (no inter-token figures)."""
        now = time.perf_counter()
        for out in outs:
            self.m.generation_tokens.inc(len(out.token_ids))
            self.m.requests.labels(out.finish_reason or "abort").inc()
        if outs:
            self.m.prompt_tokens.inc(outs[0].usage.prompt_tokens)
            self.m.cached_tokens.inc(outs[0].usage.cached_tokens)
        self.m.ttft.observe(now - self.start)  # the whole answer is its first token here

    def done(self) -> None:
        """The request ended (however): its end-to-end latency."""
        self.m.e2e.observe(time.perf_counter() - self.start)
