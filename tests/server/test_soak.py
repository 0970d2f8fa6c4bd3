"""The HTTP soak at CI size (RADIXSERVE_SOAK_REQUESTS, default 80; the benchmark runs 1,000)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from radixserve.server.runner import ServerThread
from tests.server.conftest import API_KEY, LIMITS, settled

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_soak() -> Any:
    spec = importlib.util.spec_from_file_location("radixserve_soak_server", BENCH / "soak_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_soak_mixed_requests_disconnects_and_invalid_bodies(live: ServerThread) -> None:
    n = int(os.environ.get("RADIXSERVE_SOAK_REQUESTS", "80"))
    soak = _load_soak()
    report = asyncio.run(soak.soak(live.url, API_KEY, n, 16, LIMITS.max_body_bytes, seed=1))
    assert not report["failed"] and not report["errors"], report
    assert sum(report["ok"].values()) == n and report["still_serving"]
    assert {"disconnect_stream", "bad_json", "stream_n", "completion_n"} <= set(report["ok"])
    settled(live)  # nothing running, every KV slot accounted for
    assert live.app.state.gate.in_flight == 0
