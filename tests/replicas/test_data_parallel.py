"""`EngineConfig(data_parallel_size=N)`: N replicas behind the same `AsyncEngine` API.

Through the public API only (the blocking `Engine`, `AsyncEngine`, the HTTP app): greedy
outputs equal one engine's; `abort` and cancelling reach the replica that holds the
request; `flush_cache`, `stats`, `check_integrity` and `/metrics` cover every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from engine.conftest import engine_config, make_prompts, with_engine

from radixserve import AsyncEngine, Engine, EngineConfig, RequestOutput, SamplingParams

from .conftest import T, dp_config

GREEDY = SamplingParams(temperature=0, max_tokens=12)
LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
STORIES = [
    "Tell me a long story about a lighthouse keeper",
    "Describe every planet of the solar system in turn",
    "Write the history of the printing press",
    "Explain how a compiler turns source code into machine code",
]


async def _settled(eng: AsyncEngine) -> dict[str, Any]:
    """Stats once nothing runs (aborts reach the workers between steps), KV accounted for."""
    for _ in range(400):
        s = await eng.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            break
        await asyncio.sleep(0.05)
    assert s["running"] == 0 and s["waiting"] == 0, s
    await eng.check_integrity()
    return s


def test_greedy_outputs_equal_one_engines(dp: Engine, tokenizer: Any) -> None:
    prompts: list[Any] = make_prompts(tokenizer)[::3]  # text and chat-templated ids
    prompts += ["Once upon a time", [{"role": "user", "content": "What is a radix tree?"}]]

    async def run_all(eng: AsyncEngine) -> tuple[Any, ...]:
        outs = await asyncio.gather(*(eng.complete(p, GREEDY) for p in prompts))
        streamed: list[int] = []
        async for out in eng.generate(prompts[0], GREEDY):
            streamed += out.delta_token_ids
        two = await eng.complete(prompts[1], SamplingParams(temperature=0, max_tokens=6, n=2))
        assert isinstance(two, list)
        return [o.token_ids for o in outs], streamed, [o.token_ids for o in two]  # type: ignore[union-attr]

    want = asyncio.run(with_engine(engine_config(), run_all))
    before = dp.stats()
    assert dp.run(run_all(dp.engine)) == want
    after = dp.stats()
    for i in range(3):  # every replica took part
        assert after[f"replica{i}_routed"] > before[f"replica{i}_routed"], after


def test_abort_and_cancel_reach_the_replica_that_holds_the_request(dp: Engine) -> None:
    async def body(eng: AsyncEngine) -> None:
        streams = [eng.generate(p, LONG, request_id=f"story{i}") for i, p in enumerate(STORIES)]
        for s in streams:
            await asyncio.wait_for(s.__anext__(), T)  # each one runs
        s = await eng.stats()
        assert all(s[f"replica{i}_in_flight"] >= 1 for i in range(3)), s  # spread over all
        # abort() by id: each ends early with finish_reason "abort", wherever it runs
        for i in (0, 1, 2):
            await eng.abort(f"story{i}")
        for stream in streams[:3]:
            last: RequestOutput | None = None
            async for last in stream:  # noqa: B007
                pass
            assert last is not None and last.finish_reason == "abort" and len(last.token_ids) < 400
        # cancelling the task that reads a stream aborts it too
        reading = asyncio.Event()

        async def read() -> None:
            async for _ in streams[3]:
                reading.set()

        task = asyncio.ensure_future(read())
        await asyncio.wait_for(reading.wait(), T)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = await _settled(eng)
        assert all(s[f"replica{i}_in_flight"] == 0 for i in range(3)), s
        assert s["replicas_healthy"] == 3

    dp.run(body(dp.engine))


def test_flush_cache_empties_every_replica_and_the_router_index(dp: Engine) -> None:
    for p in STORIES:
        dp.complete(p, GREEDY)
    s = dp.stats()
    assert s["cached_tokens"] > 0 and s["router_index_tokens"] > 0
    assert dp.flush_cache() is True
    s = dp.stats()
    assert s["cached_tokens"] == 0 and s["router_index_tokens"] == 0
    before = s["router_decisions_prefix"]
    out = dp.complete(STORIES[0], GREEDY)
    assert out.usage.cached_tokens == 0  # type: ignore[union-attr]
    assert dp.stats()["router_decisions_prefix"] == before  # nothing left to follow


def test_a_repeated_prompt_goes_where_its_prefix_is(dp: Engine) -> None:
    first = dp.complete(STORIES[1], GREEDY)
    s = dp.stats()
    again = dp.complete(STORIES[1] + " and its people", GREEDY)
    after = dp.stats()
    assert after["router_decisions_prefix"] == s["router_decisions_prefix"] + 1
    assert again.usage.cached_tokens >= first.usage.prompt_tokens  # type: ignore[union-attr]


def test_bad_requests_raise_in_the_caller_and_leave_no_load(dp: Engine) -> None:
    async def body(eng: AsyncEngine) -> None:
        with pytest.raises(ValueError, match="empty"):
            await eng.complete([], GREEDY)
        with pytest.raises(TypeError, match="SamplingParams"):
            await eng.complete("hi", {"max_tokens": 3})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="context"):
            await eng.complete([1] * (eng.context_length + 1), GREEDY)
        stream = eng.generate(STORIES[0], LONG, request_id="mine")
        await asyncio.wait_for(stream.__anext__(), T)
        with pytest.raises(ValueError, match="already running"):
            await eng.complete("hi", GREEDY, request_id="mine")
        await stream.aclose()  # type: ignore[attr-defined]
        s = await _settled(eng)
        assert all(s[f"replica{i}_in_flight"] == 0 for i in range(3)), s

    dp.run(body(dp.engine))


def test_the_http_app_serves_replicas_and_exports_the_router(dp: Engine) -> None:
    import httpx2

    from radixserve.server import create_app, inprocess_openai
    from radixserve.server.inprocess_transport import InProcessTransport

    app = create_app(dp.engine)
    client = inprocess_openai(app)
    chat = client.chat.completions.create(
        model=dp.engine.config.model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
    )
    assert chat.choices[0].message.content
    assert dp.engine.loop is not None
    transport = InProcessTransport(app, dp.engine.loop)
    with httpx2.Client(transport=transport, base_url="http://localhost") as http:
        assert http.get("/health").status_code == 200
        text = http.get("/metrics").text
    assert 'radixserve_router_decisions_total{decision="prefix"}' in text
    for i in range(3):
        assert f'radixserve_replica_healthy{{replica="{i}"}} 1.0' in text
    client.close()


def test_configs_of_replicas() -> None:
    assert AsyncEngine(engine_config()).replicas == ()
    eng = AsyncEngine(engine_config(), data_parallel_size=2)
    assert len(eng.replicas) == 2
    assert [r.config.device for r in eng.replicas] == ["cpu", "cpu"]
    assert all(r.config.data_parallel_size is None and not r.replicas for r in eng.replicas)
    listed = AsyncEngine(engine_config(data_parallel_devices=["cpu", "cpu", "cpu"]))
    assert len(listed.replicas) == 3
    assert dp_config(2).data_parallel_devices is None
    for bad, field in (
        (dict(data_parallel_size=0), "data_parallel_size"),
        (dict(data_parallel_size=True), "data_parallel_size"),
        (dict(data_parallel_size=2, data_parallel_devices=("cpu",)), "data_parallel_size"),
        (dict(data_parallel_devices=()), "data_parallel_devices"),
        (dict(data_parallel_devices="cpu"), "data_parallel_devices"),
    ):
        with pytest.raises(ValueError, match=field):
            EngineConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(eng.complete("hi"))


def test_a_blocking_engine_of_replicas_closes_cleanly() -> None:
    with contextlib.closing(Engine(dp_config(2))) as eng:
        out = eng.complete("Hello", GREEDY)
        assert out.finish_reason in ("stop", "length")  # type: ignore[union-attr]
        assert eng.stats()["replicas_healthy"] == 2
