"""The worker watchdog: a step that never returns fails its callers instead of hanging them.

A fault hook (`radixserve.testing.inject_faults`, run on the worker thread after a forward)
blocks on an event when the step holds the marked request, as a library call that does not
end would. With `watchdog_timeout_s=1`, every pending request fails with
`EngineStalledError`, `healthy` and `/health` say so, new requests are refused at once, and
`shutdown()` returns; once the step ends after all, the engine serves again with every KV slot
accounted for.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from engine.conftest import engine_config

from radixserve import AsyncEngine, EngineStalledError, SamplingParams
from radixserve.server import create_app
from radixserve.testing import inject_faults

pytestmark = pytest.mark.timeout(120)

MARK_SEED = 777
VICTIM = SamplingParams(max_tokens=8, temperature=0.8, seed=MARK_SEED)
BYSTANDER = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)


def _blocking_hook(release: threading.Event, entered: threading.Event) -> Any:
    def hook(step: int, logits: Any, sampling: Any) -> Any:
        if any(p.seed == MARK_SEED for p in sampling.params) and not release.is_set():
            entered.set()
            release.wait(60)  # the stuck step; the test sets `release` to let it end
        return logits

    return hook


async def _outcome(coro: Any) -> Any:
    try:
        return await asyncio.wait_for(coro, 20)
    except Exception as e:  # noqa: BLE001 - the test looks at what each caller got
        return e


def test_stalled_step_fails_its_callers_and_the_engine_recovers() -> None:
    async def body() -> None:
        release, entered = threading.Event(), threading.Event()
        async with AsyncEngine(engine_config(watchdog_timeout_s=1.0)) as engine:
            inject_faults(engine, _blocking_hook(release, entered))
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://localhost"
            )
            bystander = asyncio.ensure_future(_outcome(engine.complete("Once upon a time", BYSTANDER)))
            t0 = time.monotonic()
            victim = await _outcome(engine.complete("Hello", VICTIM))
            waited = time.monotonic() - t0
            assert entered.is_set()
            assert isinstance(victim, EngineStalledError), victim
            assert "watchdog_timeout_s=1" in str(victim) and "no progress" in str(victim)
            assert waited < 10
            assert isinstance(await bystander, EngineStalledError)
            assert not engine.healthy
            assert (await client.get("/health")).status_code == 503
            with pytest.raises(EngineStalledError):  # refused at once while stalled
                await engine.complete("hi", SamplingParams(max_tokens=2))

            release.set()  # the step ends after all
            for _ in range(100):
                if engine.healthy:
                    break
                await asyncio.sleep(0.05)
            assert engine.healthy
            assert (await client.get("/health")).status_code == 200
            out = await asyncio.wait_for(engine.complete("The sky is", SamplingParams(max_tokens=4)), 30)
            assert len(out.token_ids) >= 1
            inject_faults(engine, None)
            assert (await engine.stats())["watchdog_stalls"] == 1
            for _ in range(100):  # the failed requests' aborts land on the worker
                stats = await engine.stats()
                if stats["running"] == 0 and stats["waiting"] == 0:
                    break
                await asyncio.sleep(0.05)
            await engine.check_integrity()
            await client.aclose()

    asyncio.run(body())


def test_shutdown_returns_while_a_step_is_stuck() -> None:
    release, entered = threading.Event(), threading.Event()

    async def body() -> float:
        engine = await AsyncEngine(engine_config(watchdog_timeout_s=1.0)).start()
        inject_faults(engine, _blocking_hook(release, entered))
        victim = asyncio.ensure_future(_outcome(engine.complete("Hello", VICTIM)))
        while not entered.is_set():
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await asyncio.wait_for(engine.shutdown(drain=True), 30)
        took = time.monotonic() - t0
        assert isinstance(await victim, EngineStalledError)
        return took

    try:
        took = asyncio.run(body())
    finally:
        release.set()  # let the abandoned worker thread end
    assert took < 10


def test_watchdog_timeout_is_validated() -> None:
    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="watchdog_timeout_s"):
            engine_config(watchdog_timeout_s=bad)
    assert engine_config(watchdog_timeout_s=None).watchdog_timeout_s is None
