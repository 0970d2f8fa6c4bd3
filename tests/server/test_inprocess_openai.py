"""The in-process OpenAI clients of `radixserve.testing` (`openai_client`, `async_openai_client`):
the app over the shared engine, no port; chat completions plain and streamed, sync and async
(from a loop of the test's own and from the engine's loop), equal to the engine's own greedy
answer; a stream arrives as the engine produces it, and closing it early ends the request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from radixserve.blocking import Engine
from radixserve.sampling_params import SamplingParams
from radixserve.server import create_app, inprocess_async_openai

MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 12


@pytest.fixture
def expected(radixserve_engine: Engine) -> str:
    """The engine's own greedy answer to MESSAGES."""
    out = radixserve_engine.complete(MESSAGES, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert out.text
    return str(out.text)


def _model(engine: Engine) -> str:
    return engine.engine.config.model


def test_sync_chat_completion(openai_client: openai.OpenAI, radixserve_engine: Engine, expected: str) -> None:
    reply = openai_client.chat.completions.create(
        model=_model(radixserve_engine), messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == expected
    assert reply.usage is not None and reply.usage.completion_tokens <= MAX_TOKENS
    assert [m.id for m in openai_client.models.list()] == [_model(radixserve_engine)]
    with pytest.raises(openai.NotFoundError, match="does not exist"):  # the app's errors come through
        openai_client.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=1)


def test_sync_chat_completion_streamed(
    openai_client: openai.OpenAI, radixserve_engine: Engine, expected: str
) -> None:
    stream = openai_client.chat.completions.create(
        model=_model(radixserve_engine),
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 1  # piece by piece
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= MAX_TOKENS


def test_a_stream_arrives_as_it_is_made_and_closing_it_ends_the_request(
    openai_client: openai.OpenAI, radixserve_engine: Engine
) -> None:
    stream = openai_client.chat.completions.create(
        model=_model(radixserve_engine),
        messages=MESSAGES,
        max_tokens=400,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    # A transport that buffered the body would hand over the first piece only at the end.
    assert radixserve_engine.stats()["running"] == 1
    stream.close()  # the app sees the client leave and aborts the request
    deadline = time.monotonic() + 60  # a hang check: far longer than an abort takes
    while radixserve_engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert radixserve_engine.stats()["running"] == 0
    radixserve_engine.check_integrity()


def test_async_client_from_a_loop_of_its_own(
    async_openai_client: openai.AsyncOpenAI, radixserve_engine: Engine, expected: str
) -> None:
    model = _model(radixserve_engine)

    async def body() -> tuple[str | None, str]:
        reply = await async_openai_client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
        )
        stream = await async_openai_client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        return reply.choices[0].message.content, text

    plain, streamed = asyncio.run(asyncio.wait_for(body(), 120))
    assert plain == streamed == expected


def test_async_client_on_the_engines_own_loop(
    radixserve_run: Any, radixserve_engine: Engine, expected: str
) -> None:
    app = create_app(radixserve_engine.engine)

    async def body(engine: Any) -> list[str | None]:
        client = inprocess_async_openai(app)
        async with client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=engine.config.model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
                    )
                    for _ in range(3)
                )
            )
        return [r.choices[0].message.content for r in replies]

    assert radixserve_run(lambda engine: asyncio.wait_for(body(engine), 120)) == [expected] * 3
