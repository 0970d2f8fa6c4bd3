"""Tool calls over `/v1/chat/completions` with the real `openai` client: a multi-turn tool loop
(call -> tool result -> answer), sync, async and streamed, against the in-process fixtures and
against `radixserve serve` in its own process; bad tools are 400s naming the field."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from typing import Any

import jsonschema
import openai
import pytest

from radixserve.blocking import Engine
from radixserve.server import inprocess_async_openai

from .conftest import MODEL, start_serve

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
QUESTION: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED: dict[str, Any] = {"tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}


def _tool_turn(call_id: str, name: str, arguments: str) -> list[Any]:
    """The assistant's call and the tool's answer, as a client appends them."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temperature": 21})},
    ]


def _check_call(name: str, arguments: str) -> None:
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[name]
    jsonschema.validate(json.loads(arguments), schema)


def sync_loop(client: openai.OpenAI, model: str) -> str:
    """Call -> result -> answer with the sync client; returns the answer."""
    first = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, max_tokens=64, **FORCED
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    _check_call(call.function.name, call.function.arguments)
    turn = _tool_turn(call.id, call.function.name, call.function.arguments)
    second = client.chat.completions.create(
        model=model, messages=QUESTION + turn, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0
    )
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.tool_calls is None
    assert answer.message.content
    return answer.message.content


async def async_streamed_loop(client: openai.AsyncOpenAI, model: str) -> str:
    """The same loop with the async client, streaming both turns."""
    stream = await client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, max_tokens=64, stream=True, **FORCED
    )
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    async for chunk in stream:
        for c in chunk.choices:
            assert not c.delta.content or "<tool_call>" not in c.delta.content
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = d.id or entry["id"]
                entry["name"] = (d.function.name if d.function else None) or entry["name"]
                entry["arguments"] += (d.function.arguments if d.function else None) or ""
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert reasons == ["tool_calls"] and list(calls) == [0]
    call = calls[0]
    _check_call(call["name"], call["arguments"])
    turn = _tool_turn(call["id"], call["name"], call["arguments"])
    stream = await client.chat.completions.create(
        model=model, messages=QUESTION + turn, tools=TOOLS, max_tokens=16, temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text
    return text


def test_tool_loop_in_process_sync(openai_client: openai.OpenAI, radixserve_engine: Engine) -> None:
    model = radixserve_engine.engine.config.model
    sync_loop(openai_client, model)
    named = openai_client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=64,
        temperature=0,
    )
    calls = named.choices[0].message.tool_calls or []
    assert calls and all(c.function.name == "add" for c in calls)
    for c in calls:
        _check_call("add", c.function.arguments)


def test_tool_loop_in_process_async_streamed(radixserve_engine: Engine) -> None:
    from radixserve.server import create_app

    app = create_app(radixserve_engine.engine)
    model = radixserve_engine.engine.config.model

    async def body() -> None:
        async with inprocess_async_openai(app) as client:
            await async_streamed_loop(client, model)

    asyncio.run(asyncio.wait_for(body(), 120))


@pytest.mark.parametrize(
    ("change", "param", "message"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not one of"),
        ({"tool_choice": "sometimes"}, "tool_choice", "must be one of"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]},
            "tools",
            "",
        ),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"parallel_tool_calls": "maybe"}, "parallel_tool_calls", ""),
        ({"response_format": {"type": "json_object"}}, "tool_choice", "cannot be combined"),
        (
            {"messages": QUESTION + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
            "messages",
            "tool_call_id",
        ),
    ],
)
def test_bad_tools_are_400s_naming_the_field(
    openai_client: openai.OpenAI,
    radixserve_engine: Engine,
    change: dict[str, Any],
    param: str | None,
    message: str,
) -> None:
    body: dict[str, Any] = {"messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 4}
    body.update(change)
    if body["tools"] is None:
        del body["tools"]
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.chat.completions.create(model=radixserve_engine.engine.config.model, **body)
    assert message in str(err.value)
    if param is not None:
        assert err.value.body is not None and err.value.body.get("param") == param  # type: ignore[union-attr]
    assert radixserve_engine.engine.healthy


def test_tool_loop_against_radixserve_serve() -> None:
    """The real thing: `radixserve serve` in its own process, the sync and async clients."""
    proc, url = start_serve("k")
    try:
        sync_loop(openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=120), MODEL)

        async def body() -> None:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=120)
            async with client:
                await async_streamed_loop(client, MODEL)

        asyncio.run(asyncio.wait_for(body(), 120))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
