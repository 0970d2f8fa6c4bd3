"""The soak (benchmarks/soak.py) at a CI size: mixed requests and faults under a tiny KV pool.

RADIXSERVE_SOAK_REQUESTS=2000 runs it at full size (the figures in BENCHMARKS.md come from
`python benchmarks/soak.py --requests 2000`)."""

from __future__ import annotations

import asyncio
import os

import pytest
from script_loader import BENCHMARKS, load_script

N = int(os.environ.get("RADIXSERVE_SOAK_REQUESTS", "100"))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_soak() -> None:
    fig = asyncio.run(load_script(BENCHMARKS / "soak.py", "radixserve_bench_soak").run_soak(N, seed=1))
    assert fig["requests"] == N + 0 and not fig["failures"], fig["failures"][:5]
    assert fig["slots_leaked"] == 0 and fig["healthy_at_end"]
    assert fig["retractions"] > 0, "the pool was meant to be small enough to retract"
    assert fig["faults_injected"] >= N // 5 and fig["outputs_checked"] >= N // 3, fig
    assert fig["rss_growth_mb"] < 512, fig
