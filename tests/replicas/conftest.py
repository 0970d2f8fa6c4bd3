"""Fixtures of the replica tests: engines of 2-3 replicas of the embedded model on the CPU.

Each replica is a full engine with its own worker thread and KV pool; pools are kept small
(`KV_TOKENS` each) so several replicas fit beside the other tests' engines.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine.conftest import engine_config

from radixserve import Engine, EngineConfig

KV_TOKENS = 4096
T = 120  # seconds a test waits for anything before it fails instead of hanging


def dp_config(replicas: int, **kw: Any) -> EngineConfig:
    return engine_config(data_parallel_size=replicas, kv_cache_tokens=KV_TOKENS, **kw)


@pytest.fixture(scope="module")
def dp() -> Iterator[Engine]:
    """Three replicas behind one blocking Engine; every replica healthy and intact at the end."""
    eng = Engine(dp_config(3))
    yield eng
    assert eng.healthy
    stats = eng.stats()
    assert stats["replicas_healthy"] == 3, stats
    eng.check_integrity()
    eng.close()
