"""The HTTP soak at CI size (RADIXSERVE_SOAK_REQUESTS, default 48; the benchmark's record: 2,000).

The plan sends one request of every kind first, then a mix drawn from the seed, so the CI size
still sends each one (asserted): hostile schemas, deep and huge bodies among them."""

from __future__ import annotations

import asyncio
import os

import pytest
from script_loader import BENCHMARKS, load_script

from radixserve.server.runner import ServerThread

from .conftest import API_KEY, LIMITS, settled


@pytest.mark.slow
def test_soak_mixed_requests_disconnects_and_invalid_bodies(live: ServerThread) -> None:
    n = int(os.environ.get("RADIXSERVE_SOAK_REQUESTS", "48"))
    soak = load_script(BENCHMARKS / "soak_server.py", "radixserve_soak_server")
    report = asyncio.run(soak.soak(live.url, API_KEY, n, 16, LIMITS.max_body_bytes, seed=1))
    assert not report["failed"] and not report["errors"], report
    assert sum(report["ok"].values()) == n and report["still_serving"]
    if n >= len(soak.KINDS):
        assert set(report["ok"]) == {kind for kind, _ in soak.KINDS}, report["ok"]
    settled(live)  # nothing running, every KV slot accounted for
    assert live.app.state.gate.in_flight == 0
