"""The cache-aware router keeps a shared-prefix workload's cache hits (W8 in BENCHMARKS.md, CPU size).

Groups of requests share a long prefix, groups interleaved in arrival order, all submitted
at once. One engine prefills each prefix once; replicas behind the cache-aware router must
serve at least 95% of its cached tokens, where round-robin spreads every group over every
replica and prefills each prefix once per replica (3 replicas: with 2, round-robin over 4
interleaved groups would send each group to one replica by accident). The three are printed side by side
(`pytest -s`); benchmarks/bench_replicas.py measures the same at any size.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from engine.conftest import engine_config

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.config import RouterConfig

from .conftest import KV_TOKENS, T, dp_config

pytestmark = pytest.mark.timeout(600)

GROUPS, PER_GROUP, PREFIX, QUESTION = 4, 6, 200, 16
REPLICAS = 3
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def workload(vocab: int = 49152, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randint(0, vocab - 1) for _ in range(PREFIX)] for _ in range(GROUPS)]
    return [
        prefixes[g] + [rng.randint(0, vocab - 1) for _ in range(QUESTION)]
        for _ in range(PER_GROUP)
        for g in range(GROUPS)  # interleaved: one request of each group in turn
    ]


async def _cached_tokens(cfg: EngineConfig, requests: list[list[int]]) -> tuple[int, list[list[int]]]:
    async with AsyncEngine(cfg) as eng:
        calls = (eng.complete(ids, PARAMS) for ids in requests)
        outs = await asyncio.wait_for(asyncio.gather(*calls), T)
        await eng.check_integrity()
    return sum(o.usage.cached_tokens for o in outs), [list(o.token_ids) for o in outs]  # type: ignore[union-attr]


def test_cache_aware_router_keeps_one_engines_cache_hits() -> None:
    requests = workload()
    ideal = GROUPS * (PER_GROUP - 1) * PREFIX
    single, want = asyncio.run(_cached_tokens(engine_config(kv_cache_tokens=KV_TOKENS), requests))
    aware, got_aware = asyncio.run(_cached_tokens(dp_config(REPLICAS), requests))
    rr_cfg = dp_config(REPLICAS, router=RouterConfig(policy="round_robin"))
    rr, got_rr = asyncio.run(_cached_tokens(rr_cfg, requests))
    print(f"\nW8 (CPU: {GROUPS} groups x {PER_GROUP}, {PREFIX}-token prefixes), {REPLICAS} replicas")
    print(f"{'':<22}{'cached tokens':>14}{'/ ideal':>9}{'/ one engine':>14}")
    for name, cached in (("one engine", single), ("cache-aware router", aware), ("round-robin", rr)):
        print(f"{name:<22}{cached:>14}{cached / ideal:>9.3f}{cached / single:>14.3f}")
    assert got_aware == want and got_rr == want  # greedy: the same tokens wherever they ran
    assert aware >= 0.95 * single
    assert rr < aware  # each group's prefix prefilled on both replicas
