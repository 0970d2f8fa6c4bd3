"""Tool calls through `AsyncEngine.complete` / `generate` on the embedded model: forced calls follow
their tool's JSON schema, streams add up to the final calls, calls are deterministic in a busy
batch, a tool result gets an answer, and wrong requests are ValueErrors naming the field.

The forced-call test runs a CI sample of JSONSchemaBench's schemas (small prompts: every tool's
schema is in the prompt, and CPU prefill dominates). RADIXSERVE_TOOL_SCHEMAS=all runs every
schema (at least 200 must compile; 72 min with RADIXSERVE_TEST_THREADS=2 on 2 busy cores:
prefill of ~200k prompt tokens and loops of the 135M model to max_tokens; BENCHMARKS.md "Tool
calls" has the figures), a number runs that many."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from radixserve import AsyncEngine, Engine, SamplingParams
from radixserve.outputs import RequestOutput
from radixserve.prompts import render_chat

from .conftest import engine_config
from .tool_schemas import SchemaTool, schema_errors, schema_tools

SIZE = os.environ.get("RADIXSERVE_TOOL_SCHEMAS", "6")
MAX_TOKENS = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
WEATHER_CHOICE = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine(engine_config())  # overlap on: EngineConfig's default
    assert eng.engine.config.overlap_enabled
    yield eng
    assert eng.healthy
    eng.check_integrity()
    eng.close()


def ask_for(t: SchemaTool) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Call {t.name} with an example item."}]


def sample(tools: list[SchemaTool]) -> list[SchemaTool]:
    """All tools, or SIZE of them spread over the file among those with short schemas."""
    if SIZE == "all":
        return tools
    small = [t for t in tools if len(json.dumps(t.parameters)) <= 600]
    step = max(1, len(small) // int(SIZE))
    return small[::step][: int(SIZE)]


async def forced_call(engine: AsyncEngine, t: SchemaTool, choice: Any) -> RequestOutput | str:
    """The final output, or the compile error of a schema xgrammar cannot compile."""
    try:
        out = await engine.complete(
            ask_for(t), GREEDY, tools=[t.tool], tool_choice=choice, parallel_tool_calls=False
        )
    except ValueError as e:
        if not str(e).startswith("structural_tag:"):
            raise
        return str(e)
    assert isinstance(out, RequestOutput)
    return out


@pytest.mark.timeout(3 * 3600 if SIZE == "all" else 600)
def test_forced_calls_follow_their_schema(engine: Engine) -> None:
    tools = sample(schema_tools())
    # Every fourth one under "required" (its one tool), the others named.
    choices = ["required" if i % 4 == 3 else t.choice() for i, t in enumerate(tools)]

    async def body() -> list[RequestOutput | str]:
        return await asyncio.gather(*(forced_call(engine.engine, t, c) for t, c in zip(tools, choices)))

    results = engine.run(body())
    uncompiled = {t.id: r for t, r in zip(tools, results) if isinstance(r, str)}
    outs = [(t, r) for t, r in zip(tools, results) if not isinstance(r, str)]
    finished = [(t, o) for t, o in outs if o.finish_reason == "tool_calls"]
    cut = [(t, o) for t, o in outs if o.finish_reason == "length"]
    print(
        f"\n{len(tools)} tools: {len(finished)} calls, {len(cut)} cut by max_tokens, "
        f"{len(uncompiled)} not compiled {sorted(uncompiled)}"
    )
    assert len(finished) + len(cut) == len(outs), [(t.id, o.finish_reason) for t, o in outs]
    for t, o in finished:  # 100% of finished forced calls parse and follow their schema
        assert len(o.tool_calls) == 1 and o.text == "", (t.id, o.text)
        call = o.tool_calls[0]
        assert call.name == t.name and call.id.startswith("call_")
        assert schema_errors(call.arguments, t.parameters) == [], (t.id, call.arguments)
    for t, o in cut:  # a call cut off is no call: its text comes back as content
        assert o.tool_calls == () and len(o.token_ids) == MAX_TOKENS, t.id
        assert o.text.startswith('<tool_call>\n{"name": "' + t.name), (t.id, o.text[:80])
    if SIZE == "all":
        assert len(outs) >= 200 and len(uncompiled) <= len(tools) - 200, uncompiled
    else:
        assert not uncompiled, uncompiled
    # The 135M model repeats itself inside some arrays until max_tokens: most still finish.
    assert len(finished) >= len(outs) // 2, [(t.id, o.text[-60:]) for t, o in cut]


async def collect(
    engine: AsyncEngine, messages: Any, params: SamplingParams, **kw: Any
) -> list[RequestOutput]:
    return [o async for o in engine.generate(messages, params, **kw)]


def test_streamed_call_adds_up_to_the_final_call(engine: Engine) -> None:
    outs = engine.run(
        collect(
            engine.engine, ASK, GREEDY, tools=[WEATHER], tool_choice=WEATHER_CHOICE, parallel_tool_calls=False
        )
    )
    final = outs[-1]
    assert final.finish_reason == "tool_calls" and len(final.tool_calls) == 1
    assert all("<tool_call>" not in o.delta_text and "</tool_call>" not in o.delta_text for o in outs)
    assert "".join(o.delta_text for o in outs) == final.text == ""
    deltas = [d for o in outs for d in o.delta_tool_calls]
    call = final.tool_calls[0]
    assert {d.index for d in deltas} == {0}
    assert [d.id for d in deltas if d.id is not None] == [call.id]
    assert [d.name for d in deltas if d.name is not None] == ["get_weather"]
    assert "".join(d.arguments for d in deltas) == call.arguments
    assert schema_errors(call.arguments, WEATHER["function"]["parameters"]) == []  # type: ignore[index]
    # The same request through complete: the same tokens and call (a new id).
    whole = engine.complete(
        ASK, GREEDY, tools=[WEATHER], tool_choice=WEATHER_CHOICE, parallel_tool_calls=False
    )
    assert whole.token_ids == final.token_ids
    assert (whole.tool_calls[0].name, whole.tool_calls[0].arguments) == (call.name, call.arguments)


@pytest.mark.parametrize(
    "params",
    [GREEDY, SamplingParams(temperature=0.8, seed=7, max_tokens=MAX_TOKENS)],
    ids=["greedy", "seeded"],
)
def test_a_call_is_the_same_alone_and_in_a_busy_batch(engine: Engine, params: SamplingParams) -> None:
    kw: dict[str, Any] = dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    others: list[tuple[Any, SamplingParams, dict[str, Any]]] = []
    for i in range(16):
        p = SamplingParams(temperature=0.8 if i % 2 else 0.0, seed=i, max_tokens=24 + i)
        q = [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]
        if i % 3 == 0:
            others.append((q, p, {}))
        elif i % 3 == 1:
            others.append((q, p, dict(tools=[WEATHER], tool_choice="auto")))
        else:
            others.append((ASK, p, dict(tools=[WEATHER], tool_choice=WEATHER_CHOICE)))

    async def busy() -> RequestOutput:
        e = engine.engine
        outs = await asyncio.gather(
            *(e.complete(m, p, **k) for m, p, k in others[:8]),
            e.complete(ASK, params, **kw),
            *(e.complete(m, p, **k) for m, p, k in others[8:]),
        )
        return outs[8]  # type: ignore[return-value]

    alone = engine.complete(ASK, params, **kw)
    engine.flush_cache()
    among = engine.run(busy())
    assert among.token_ids == alone.token_ids
    assert [(c.name, c.arguments) for c in among.tool_calls] == [
        (c.name, c.arguments) for c in alone.tool_calls
    ]
    assert among.finish_reason == alone.finish_reason


def test_a_tool_result_gets_an_answer(engine: Engine) -> None:
    first = engine.complete(ASK, GREEDY, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert first.finish_reason == "tool_calls"
    call = first.tool_calls[0]
    turn = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    answer = engine.complete(
        turn, SamplingParams(temperature=0.0, max_tokens=48), tools=[WEATHER], tool_choice="auto"
    )
    assert answer.finish_reason in ("stop", "length") and answer.tool_calls == ()
    assert answer.text.strip()  # (the 135M model mostly echoes the result back)
    # The prompt held the call and its result (the default Hermes tool prompt's turns).
    shown = render_chat(engine.tokenizer, turn, tools=[WEATHER])
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {call.arguments}}}\n</tool_call>' in shown
    assert '<tool_response>\n{"temperature": 18, "sky": "clear"}\n</tool_response>' in shown
    assert answer.usage.prompt_tokens == len(engine.tokenizer.encode(shown, add_special_tokens=False))


def test_a_forced_call_with_raw_control_characters_is_a_call(engine: Engine) -> None:
    """xgrammar lets a length-bounded string of a structural tag hold raw control characters;
    a forced call that has them is still a call (here a bias makes the model write tabs)."""
    note = {
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 10}},
        "required": ["text"],
    }
    tool = {"type": "function", "function": {"name": "note", "parameters": note}}
    (tab,) = engine.tokenizer.encode("\t", add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=48, logit_bias={tab: 30.0})
    out = engine.complete(ASK, params, tools=[tool], tool_choice="required", parallel_tool_calls=False)
    assert "\t" in engine.tokenizer.decode(list(out.token_ids))
    assert out.finish_reason == "tool_calls" and out.text == "", out.text
    assert json.loads(out.tool_calls[0].arguments) == {"text": "\t" * 10}
    assert schema_errors(out.tool_calls[0].arguments, note) == []


BAD_SCHEMA = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": 3}},
}
ORPHAN = [*ASK, {"role": "tool", "tool_call_id": "call_missing", "content": "18 degrees"}]


@pytest.mark.parametrize(
    ("prompt", "kw", "field"),
    [
        (
            ASK,
            dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice.function.name",
        ),
        (ASK, dict(tools=[BAD_SCHEMA]), "tools[0].function.parameters['properties']"),
        (ASK, dict(tool_choice="required"), "tool_choice="),
        ("What is the weather in Paris?", dict(tools=[WEATHER]), "tools"),
        (ORPHAN, dict(tools=[WEATHER]), "messages[1].tool_call_id"),
        (ASK, dict(tools=[WEATHER], parallel_tool_calls="yes"), "parallel_tool_calls"),
        (
            ASK,
            dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
            "tools[0].function.parameters.type",
        ),
    ],
    ids=[
        "unknown-name",
        "invalid-schema",
        "choice-without-tools",
        "text-prompt",
        "orphan-result",
        "parallel",
        "non-object",
    ],
)
def test_wrong_requests_name_the_field(engine: Engine, prompt: Any, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as err:
        engine.complete(prompt, SamplingParams(max_tokens=4), **kw)
    assert field in str(err.value), str(err.value)
    assert engine.healthy
    out = engine.complete(ASK, SamplingParams(temperature=0.0, max_tokens=4), tools=[WEATHER])
    assert out.finish_reason in ("length", "stop", "tool_calls")
