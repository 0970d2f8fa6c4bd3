"""The soak (benchmarks/soak.py) at a CI size: mixed requests and faults under a tiny KV pool.

RADIXSERVE_SOAK_REQUESTS=2000 runs it at full size (the figures in BENCHMARKS.md come from
`python benchmarks/soak.py --requests 2000`)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
N = int(os.environ.get("RADIXSERVE_SOAK_REQUESTS", "100"))


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("radixserve_bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_soak() -> None:
    fig = asyncio.run(_load().run_soak(N, seed=1))
    assert fig["requests"] == N + 0 and not fig["failures"], fig["failures"][:5]
    assert fig["slots_leaked"] == 0 and fig["healthy_at_end"]
    assert fig["retractions"] > 0, "the pool was meant to be small enough to retract"
    assert fig["faults_injected"] >= N // 5 and fig["outputs_checked"] >= N // 3, fig
    assert fig["rss_growth_mb"] < 512, fig
