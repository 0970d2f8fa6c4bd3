"""The engine under other event loops: uvloop, anyio's asyncio backend, and trio (via AnyioEngine)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from radixserve import AnyioEngine, AsyncEngine, EngineConfig, RequestOutput, SamplingParams

CFG = EngineConfig(model="smollm2-135m-instruct", device="cpu", dtype="float32")
CHAT = [{"role": "user", "content": "Name three animals."}]
GREEDY = SamplingParams(max_tokens=10, temperature=0)


async def exercise(engine: Any) -> str:
    """Stream, complete, n > 1 and a cancelled request; returns the greedy text."""
    streamed = "".join([out.delta_text async for out in engine.generate(CHAT, GREEDY)])
    final = await engine.complete(CHAT, GREEDY)
    assert isinstance(final, RequestOutput) and final.text == streamed
    many = await engine.complete("Once upon a time", SamplingParams(max_tokens=4, n=3, seed=1))
    assert [o.index for o in many] == [0, 1, 2]
    with anyio.move_on_after(0.5):  # cancelled mid-generation: the request is aborted
        async for _ in engine.generate("Count to a thousand:", SamplingParams(max_tokens=2000)):
            pass
    for _ in range(100):
        s = await engine.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            break
        await anyio.sleep(0.05)
    assert s["running"] == 0 and s["waiting"] == 0, s
    await engine.check_integrity()
    return streamed


@pytest.fixture(scope="module")
def anyio_engine() -> Iterator[AnyioEngine]:
    engine = AnyioEngine(CFG)
    anyio.run(engine.start, backend="trio")
    yield engine
    anyio.run(engine.shutdown, backend="trio")
    assert not engine.healthy


def test_anyio_engine_under_trio(anyio_engine: AnyioEngine) -> None:
    import trio

    async def main() -> str:
        assert trio.lowlevel.current_trio_token() is not None
        async with trio.open_nursery() as nursery:  # concurrent requests from trio tasks
            texts: list[str] = []

            async def one() -> None:
                out = await anyio_engine.complete(CHAT, GREEDY)
                texts.append(out.text)

            for _ in range(3):
                nursery.start_soon(one)
        assert texts == [texts[0]] * 3
        return await exercise(anyio_engine)

    text = trio.run(main)
    assert text and text == anyio.run(anyio_engine.complete, CHAT, GREEDY, backend="asyncio").text


def test_anyio_engine_errors_reach_the_caller(anyio_engine: AnyioEngine) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="vocabulary"):  # raised by the engine, in its own loop
            await anyio_engine.complete(CHAT, SamplingParams(logit_bias={10**9: 1.0}))
        with pytest.raises(ValueError, match="context"):
            async for _ in anyio_engine.generate("word " * 9000, GREEDY):
                pass
        await anyio_engine.check_integrity()

    anyio.run(main, backend="trio")


def test_async_engine_under_anyio_on_uvloop(anyio_engine: AnyioEngine) -> None:
    """AsyncEngine itself in anyio's asyncio backend on uvloop; same greedy text as the trio-hosted one."""

    async def main() -> tuple[str, str]:
        async with AsyncEngine(CFG) as engine:
            return type(asyncio.get_running_loop()).__module__, await exercise(engine)

    loop_module, text = anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    assert loop_module.startswith("uvloop")
    assert text == anyio.run(anyio_engine.complete, CHAT, GREEDY, backend="trio").text


def test_anyio_engine_tool_calls_under_trio(anyio_engine: AnyioEngine) -> None:
    """Tool calls pass through AnyioEngine: a forced call, whole and streamed, from trio."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    kw: dict[str, Any] = {"tools": tools, "tool_choice": "required", "parallel_tool_calls": False}
    params = SamplingParams(temperature=0, max_tokens=48)

    async def main() -> tuple[RequestOutput, list[RequestOutput]]:
        whole = await anyio_engine.complete(CHAT, params, **kw)
        parts = [o async for o in anyio_engine.generate(CHAT, params, **kw)]
        return whole, parts

    whole, parts = anyio.run(main, backend="trio")
    assert whole.finish_reason == "tool_calls" and [c.name for c in whole.tool_calls] == ["get_weather"]
    assert "city" in json.loads(whole.tool_calls[0].arguments)
    assert parts[-1].tool_calls[0].arguments == whole.tool_calls[0].arguments
    assert "".join(d.arguments for o in parts for d in o.delta_tool_calls) == whole.tool_calls[0].arguments
