"""A replica that fails fails only its own requests; shutdown ends every replica's requests.

The failure is a forward that raises on one replica's worker (`inject_faults`, as a failing
device would): its requests end with `EngineDeadError`, it is reported unhealthy and takes
no more requests, and the others serve on, their KV accounted for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from engine.conftest import hf_greedy

from radixserve import AsyncEngine, EngineClosedError, EngineDeadError, RequestOutput, SamplingParams
from radixserve.testing import inject_faults

from .conftest import T, dp_config

pytestmark = pytest.mark.timeout(300)

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
TEXTS = ["The weather today is", "A list of prime numbers:", "My favourite food is", "In the year 1900"]


def _fail(step: int, logits: torch.Tensor, sampling: Any) -> torch.Tensor:
    raise RuntimeError("injected device fault")


def test_a_failing_replica_fails_only_its_requests(tokenizer: Any, hf_model: Any) -> None:
    prompts = [tokenizer.encode(t) for t in TEXTS]
    refs = [hf_greedy(hf_model, p, 8) for p in prompts]

    async def main() -> None:
        async with AsyncEngine(dp_config(2)) as eng:
            inject_faults(eng.replicas[1], _fail)
            calls = (eng.complete(p, GREEDY) for p in prompts)
            got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), T)
            s = await eng.stats()
            failed = [r for r in got if isinstance(r, EngineDeadError)]
            assert len(failed) == s["replica1_routed"] >= 1 and "injected device fault" in str(failed[0])
            for out, ref in zip(got, refs):
                if isinstance(out, RequestOutput):  # the healthy replica's: transformers' tokens
                    assert list(out.token_ids) == ref
            assert s["replicas_healthy"] == 1 and s["replica1_healthy"] == 0 and s["replica0_healthy"] == 1
            assert eng.healthy  # it still serves
            # every new request goes to the healthy replica and succeeds
            outs = await asyncio.wait_for(asyncio.gather(*(eng.complete(p, GREEDY) for p in prompts)), T)
            assert [list(o.token_ids) for o in outs] == refs  # type: ignore[union-attr]
            s2 = await eng.stats()
            assert s2["replica0_routed"] == s["replica0_routed"] + len(prompts)
            assert s2["replica1_routed"] == s["replica1_routed"]
            await eng.check_integrity()
            assert await eng.flush_cache() is True
            # when the last replica fails too, the engine is dead and says so at once
            inject_faults(eng.replicas[0], _fail)
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(eng.complete(prompts[0], GREEDY), T)
            assert not eng.healthy
            with pytest.raises(EngineDeadError, match="every replica"):
                await asyncio.wait_for(eng.complete(prompts[0], GREEDY), 5)
            with pytest.raises(EngineDeadError):
                await eng.stats()

    asyncio.run(main())


def test_shutdown_ends_every_replicas_requests_then_restart(tokenizer: Any) -> None:
    prompts = [tokenizer.encode(t) for t in TEXTS]

    async def main() -> None:
        eng = AsyncEngine(dp_config(2))
        await eng.start()
        streams = [eng.generate(p, LONG) for p in prompts[:2]]
        for stream in streams:
            await asyncio.wait_for(stream.__anext__(), T)
        tasks = [asyncio.ensure_future(eng.complete(p, LONG)) for p in prompts[2:]]
        tasks += [asyncio.ensure_future(_drain(s)) for s in streams]
        await asyncio.sleep(0)  # the completes are routed
        s = await eng.stats()
        assert s["replica0_in_flight"] >= 1 and s["replica1_in_flight"] >= 1, s
        await asyncio.wait_for(eng.shutdown(drain=False), T)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), T)
        assert all(isinstance(r, EngineClosedError) for r in results), results
        assert not eng.healthy
        with pytest.raises(RuntimeError, match="not running"):
            await eng.complete(prompts[0], GREEDY)
        # it starts again, with a fresh router; a draining shutdown lets requests finish
        await eng.start()
        assert eng.healthy
        task = asyncio.ensure_future(eng.complete(prompts[0], GREEDY))
        await asyncio.sleep(0)
        s = await eng.stats()
        assert s["replicas_healthy"] == 2 and sum(s[f"replica{i}_routed"] for i in (0, 1)) == 1, s
        await asyncio.wait_for(eng.shutdown(drain=True), T)
        out = await task
        assert isinstance(out, RequestOutput) and len(out.token_ids) == 8

    asyncio.run(main())


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass
