"""Structural tags compile with xgrammar against the embedded model's tokenizer, and a matcher
takes the tokens of calls as the parser writes them (and refuses what the mode forbids)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr

from radixserve.constrained.xgrammar_backend import XGrammarBackend
from radixserve.tools import FunctionSpec, ToolCall, function_specs, tool_parser

TOOLS = function_specs(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    ]
)
WEATHER = ToolCall("call_0", "get_weather", json.dumps({"city": "Paris", "days": 2}))
BAD_WEATHER = ToolCall("call_1", "get_weather", json.dumps({"days": 2}))  # misses "city"
NOW = ToolCall("call_2", "now", json.dumps({"anything": [1, "x"]}))  # not strict: any object
NOW_EMPTY = ToolCall("call_4", "now", "{}")
UNKNOWN = ToolCall("call_3", "launch", "{}")
PARSERS = ["hermes", "llama3", "mistral"]


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> XGrammarBackend:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return XGrammarBackend(tokenizer, len(tokenizer.get_vocab()), [eos])


def accepts(backend: XGrammarBackend, tokenizer: Any, tag: dict[str, object], text: str) -> bool:
    """The tag takes the tokens of `text`, then its stop token."""
    m = xgr.GrammarMatcher(backend.compiler.compile_structural_tag(json.dumps(tag)))
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(m.accept_token(t) for t in ids) and m.accept_token(backend.info.stop_token_ids[0])


@pytest.mark.parametrize("name", PARSERS)
def test_auto(name: str, backend: XGrammarBackend, tokenizer: Any) -> None:
    p = tool_parser(name)
    tag = p.structural_tag(TOOLS, "auto")
    ok = lambda text: accepts(backend, tokenizer, tag, text)  # noqa: E731
    assert ok("No tool needed, the answer is 4.")
    assert ok("Let me look. " + p.write_call(WEATHER))
    assert ok(p.write_calls([WEATHER, NOW]))
    assert not ok(p.write_call(BAD_WEATHER))  # strict: the schema holds
    assert not ok(p.write_call(UNKNOWN))
    single = p.structural_tag(TOOLS, "auto", parallel=False)
    assert accepts(backend, tokenizer, single, "Sure. " + p.write_call(NOW))
    # Mistral writes both calls as one array: parallel=False allows it one item
    assert not accepts(backend, tokenizer, single, p.write_calls([WEATHER, NOW]))


@pytest.mark.parametrize("name", PARSERS)
def test_required_and_named(name: str, backend: XGrammarBackend, tokenizer: Any) -> None:
    p = tool_parser(name)
    required = p.structural_tag(TOOLS, "required")
    assert accepts(backend, tokenizer, required, p.write_call(NOW_EMPTY))
    assert accepts(backend, tokenizer, required, p.write_calls([WEATHER, NOW_EMPTY, WEATHER]))
    # forced calls follow every function's schema, strict or not
    assert not accepts(backend, tokenizer, required, p.write_call(NOW))
    assert not accepts(backend, tokenizer, required, p.write_call(BAD_WEATHER))
    assert not accepts(backend, tokenizer, required, "No call.")
    assert not accepts(backend, tokenizer, required, "Hi " + p.write_call(NOW_EMPTY))
    one = p.structural_tag(TOOLS, "required", parallel=False)
    assert accepts(backend, tokenizer, one, p.write_call(WEATHER))
    assert not accepts(backend, tokenizer, one, p.write_calls([WEATHER, NOW]))
    named = p.structural_tag(TOOLS, "named", function="get_weather")
    assert accepts(backend, tokenizer, named, p.write_call(WEATHER))
    assert not accepts(backend, tokenizer, named, p.write_call(NOW))
    assert not accepts(backend, tokenizer, named, p.write_call(BAD_WEATHER))


def test_tag_is_xgrammars_json_form() -> None:
    """Without a tokenizer too: `Grammar.from_structural_tag` takes the dict as it is."""
    tag = tool_parser("hermes").structural_tag(TOOLS, "named", parallel=False, function="now")
    assert tag["type"] == "structural_tag"
    assert "root" in str(xgr.Grammar.from_structural_tag(tag))
    assert json.loads(json.dumps(tag)) == tag


def test_mode_arguments_checked() -> None:
    p = tool_parser("hermes")
    with pytest.raises(ValueError, match="mode='none'"):
        p.structural_tag(TOOLS, "none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="function='launch'"):
        p.structural_tag(TOOLS, "named", function="launch")
    with pytest.raises(ValueError, match="only for mode 'named'"):
        p.structural_tag(TOOLS, "auto", function="now")
    with pytest.raises(ValueError, match="at least one function"):
        p.structural_tag((), "auto")
    assert FunctionSpec("x").parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize("name", PARSERS)
def test_forced_arguments_of_an_untyped_schema_are_an_object(
    name: str, backend: XGrammarBackend, tokenizer: Any
) -> None:
    """Parameters without a `type` still describe an object: a forced call cannot write an array
    (which the parser would not read as a call)."""
    p = tool_parser(name)
    for parameters in ({"description": "anything"}, {"properties": {"a": {"type": "integer"}}}):
        untyped = function_specs([{"type": "function", "function": {"name": "f", "parameters": parameters}}])
        named = p.structural_tag(untyped, "named", parallel=False, function="f")
        assert accepts(backend, tokenizer, named, p.write_call(ToolCall("call_5", "f", '{"a": 1}')))
        assert not accepts(backend, tokenizer, named, p.write_call(ToolCall("call_6", "f", "[1]")))
