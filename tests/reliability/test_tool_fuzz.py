"""Hypothesis fuzzing of the tool options through `Engine.complete`: tool lists (valid tools,
broken ones, random JSON shapes as schemas), `tool_choice`, `parallel_tool_calls` and conversations
with assistant calls and tool results. Each example is a result or a ValueError / TypeError in the
caller; the engine stays healthy and its KV intact after every one. The first test draws anything
(mostly errors at the boundary); the second, requests of the right shape, which mostly reach the
model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from radixserve import Engine, RequestOutput, SamplingParams

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mostly(valid: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` three times in four, else `wild`: most examples get past the checks to the model."""
    return st.tuples(st.integers(0, 3), valid, wild).map(lambda t: t[2] if t[0] == 0 else t[1])


text = st.text(st.characters(blacklist_categories=()), max_size=12)  # surrogates included
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(), text)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(text, kids, max_size=3)),
    max_leaves=8,
)
good_names = st.sampled_from(["get_weather", "search", "f.x-1"])
names = mostly(good_names, st.one_of(st.sampled_from(["", "bad name"]), text))
# Schema-shaped JSON: real keywords with plausible or wrong values (small numbers: the
# compile-time of huge bounds is another test's business).
keyword_values = st.one_of(
    st.sampled_from(["object", "string", "integer", "array", "number", "boolean", "null", "objekt"]),
    st.integers(0, 4),
    st.lists(st.sampled_from(["a", "b", "object", "string"]), max_size=3),
    json_values,
)


def objects(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Object schemas of properties drawn from `kids`."""
    return st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(st.sampled_from("abc"), kids, max_size=3)},
        optional={
            "required": st.lists(st.sampled_from("abcd"), max_size=3, unique=True),
            "additionalProperties": st.booleans(),
        },
    )


schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "boolean"])}),
    lambda kids: st.one_of(
        objects(kids),
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": kids}, optional={"maxItems": st.integers(0, 3)}
        ),
        st.fixed_dictionaries({"anyOf": st.lists(kids, min_size=1, max_size=2)}),
        st.dictionaries(
            st.sampled_from(
                ["type", "properties", "items", "enum", "const", "required", "$ref", "minLength"]
            ),
            keyword_values,
            max_size=3,
        ),
    ),
    max_leaves=5,
)


functions = st.fixed_dictionaries(
    {"name": names},
    optional={
        "description": st.one_of(text, scalars),
        "parameters": st.one_of(schemas, json_values),
        "strict": mostly(st.booleans(), scalars),
    },
)
good_tools = st.fixed_dictionaries({"type": st.just("function"), "function": functions})
tools = mostly(
    good_tools,
    st.one_of(
        st.fixed_dictionaries(
            {"type": st.one_of(text, scalars), "function": st.one_of(functions, json_values)}
        ),
        json_values,
    ),
)
tool_lists = mostly(st.lists(tools, min_size=1, max_size=3), st.one_of(st.none(), json_values))
choices = mostly(
    st.one_of(
        st.none(),
        st.sampled_from(["auto", "none", "required"]),
        st.builds(lambda n: {"type": "function", "function": {"name": n}}, good_names),
    ),
    st.one_of(
        st.just("any"), st.builds(lambda n: {"type": "function", "function": {"name": n}}, names), json_values
    ),
)
parallel = mostly(st.one_of(st.none(), st.booleans()), scalars)
calls = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {
                "id": st.sampled_from(["call_1", "call_2"]),
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {"name": names, "arguments": st.one_of(st.just('{"city": "Paris"}'), text, json_values)}
                ),
            },
        ),
        min_size=1,
        max_size=2,
    ),
    json_values,
)
turns = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.just("assistant"), "content": st.one_of(st.none(), text), "tool_calls": calls}
        ),
        st.fixed_dictionaries(
            {"role": st.just("tool"), "content": st.one_of(text, json_values)},
            optional={"tool_call_id": st.one_of(st.sampled_from(["call_1", "call_2"]), scalars)},
        ),
        st.dictionaries(
            st.sampled_from(["role", "content", "tool_calls", "tool_call_id"]), json_values, max_size=3
        ),
    ),
    max_size=3,
)
ASK = {"role": "user", "content": "What is the weather in Paris?"}


def _check(engine: Engine, messages: list[Any], max_tokens: int, **kw: Any) -> None:
    try:
        out = engine.complete(messages, SamplingParams(temperature=0.0, max_tokens=max_tokens), **kw)
    except (ValueError, TypeError) as e:
        assert str(e), "an error without a message"
        event(f"{type(e).__name__}: {str(e).split(':')[0].split('=')[0][:40]}")
    else:
        assert isinstance(out, RequestOutput) and out.finished
        event(f"result: {out.finish_reason}")
        assert out.finish_reason in ("stop", "length", "tool_calls"), out
        known = {t["function"]["name"] for t in kw["tools"] or ()}
        for call in out.tool_calls:  # few tokens rarely make a call; one that is made is well formed
            assert call.name in known and isinstance(json.loads(call.arguments), dict)
    assert engine.healthy
    engine.check_integrity()


@FUZZ
@given(tool_lists, choices, parallel, turns)
def test_fuzzed_tool_requests(engine: Engine, tools: Any, choice: Any, parallel: Any, turns: Any) -> None:
    _check(engine, [ASK, *turns], 3, tools=tools, tool_choice=choice, parallel_tool_calls=parallel)


@st.composite
def shaped_requests(draw: st.DrawFn) -> tuple[list[Any], dict[str, Any]]:
    """Requests of the right shape: 1-3 tools with schema-like parameters, a choice among them,
    and maybe a call with its result in the conversation."""
    picked = draw(st.lists(good_names, min_size=1, max_size=3, unique=True))
    fns = [{"name": n, "parameters": draw(objects(schemas)), "strict": draw(st.booleans())} for n in picked]
    choice = draw(
        st.one_of(
            st.sampled_from([None, "auto", "none", "required"]),
            st.builds(lambda n: {"type": "function", "function": {"name": n}}, st.sampled_from(picked)),
        )
    )
    messages: list[Any] = [ASK]
    if draw(st.booleans()):
        args = draw(st.dictionaries(st.sampled_from("abc"), json_values, max_size=2))
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": picked[0], "arguments": json.dumps(args)},
        }
        result = draw(st.one_of(text, json_values.map(json.dumps)))
        messages += [
            {"role": "assistant", "content": draw(st.one_of(st.none(), text)), "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
        ]
    kw = {
        "tools": [{"type": "function", "function": f} for f in fns],
        "tool_choice": choice,
        "parallel_tool_calls": draw(st.one_of(st.none(), st.booleans())),
    }
    return messages, kw


@FUZZ
@given(shaped_requests(), st.integers(1, 8))
def test_fuzzed_well_shaped_tool_requests(
    engine: Engine, request: tuple[list[Any], dict[str, Any]], max_tokens: int
) -> None:
    messages, kw = request
    _check(engine, messages, max_tokens, **kw)
