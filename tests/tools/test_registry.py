"""Parsers by name, a format added the documented way, and detection from chat templates."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import xgrammar as xgr

from radixserve.tools import (
    CallScanner,
    CallShape,
    Found,
    FunctionSpec,
    HermesParser,
    Malformed,
    Pending,
    RawCall,
    ReasoningFormat,
    Scan,
    ToolCall,
    ToolParser,
    arguments_text,
    detect_tool_parser,
    reasoning_parser,
    register_reasoning_parser,
    register_tool_parser,
    registry,
    tool_parser,
    tool_parser_names,
)
from radixserve.tools import reasoning as reasoning_module
from tools.helpers import calls_of, streamed


@pytest.fixture
def fresh_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(registry, "_PARSERS", dict(registry._PARSERS))
    monkeypatch.setattr(reasoning_module, "_FORMATS", dict(reasoning_module._FORMATS))
    yield


class FnScanner(CallScanner):
    """`<function=NAME>{args}</function>`: the marker is `<function=`."""

    def push(self, body: str) -> Scan:
        m = re.match(r"([\w.-]+)>(.*?)</function>", body, re.S)
        if m is None:
            return Pending() if re.fullmatch(r"[\w.-]*(>.*)?", body, re.S) else Malformed(0)
        args = arguments_text(m.group(2))
        return Malformed(m.end()) if args is None else Found((RawCall(m.group(1), args),), m.end())

    def close(self, body: str) -> Found | Malformed:
        scan = self.push(body)
        return scan if isinstance(scan, Found | Malformed) else Malformed(0)


class FnParser(ToolParser):
    markers = ("<function=",)
    trigger = "<function="

    def scanner(self, marker: str) -> CallScanner:
        return FnScanner()

    def write_call(self, call: ToolCall) -> str:
        return f"<function={call.name}>{call.arguments}</function>"

    def call_shape(self) -> CallShape:
        return CallShape("<function=", ">", "</function>")


@pytest.mark.usefixtures("fresh_registries")
def test_register_a_format() -> None:
    register_tool_parser("fn", FnParser)
    assert "fn" in tool_parser_names()
    p = tool_parser("fn")
    text = 'Hi <function=get_weather>{"city": "Paris"}</function> <function=now>{}</function>'
    want = [("get_weather", '{"city": "Paris"}'), ("now", "{}")]
    assert (p.parse(text).content, calls_of(p.parse(text))) == ("Hi", want)
    assert calls_of(streamed(p, list(text))) == want
    tag = p.structural_tag([FunctionSpec("now")], "required")
    assert "<function=now>" in str(xgr.Grammar.from_structural_tag(tag))
    with pytest.raises(ValueError, match="already registered"):
        register_tool_parser("fn", HermesParser)
    register_tool_parser("fn", HermesParser, replace=True)
    assert isinstance(tool_parser("fn"), HermesParser)
    with pytest.raises(TypeError):
        register_tool_parser("x", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of"):
        tool_parser("nope")


@pytest.mark.usefixtures("fresh_registries")
def test_register_a_reasoning_format() -> None:
    register_reasoning_parser("seed", ReasoningFormat("<seed:think>", "</seed:think>"))
    got = reasoning_parser("seed").parse("<seed:think>hm</seed:think>4")
    assert (got.reasoning, got.content) == ("hm", "4")
    with pytest.raises(ValueError, match="already registered"):
        register_reasoning_parser("qwen3", ReasoningFormat())
    with pytest.raises(ValueError, match="non-empty"):
        register_reasoning_parser("x", ReasoningFormat("", "</x>"))
    with pytest.raises(ValueError, match="not one of"):
        reasoning_parser("nope")


QWEN = (
    "{%- if tools %}...<tools>{{ tool | tojson }}</tools>...<tool_call>\\n{\"name\": <function-name>, "
    '"arguments": <args-json-object>}\\n</tool_call>{%- endif %}'
)
LLAMA31 = (
    '<|start_header_id|>ipython<|end_header_id|>{{- "<|python_tag|>" + tool_call.name }}'
    '{{- \'{"name": "\' + tool_call.name + \'", \' }}{{- \'"parameters": \' }}'
)
LLAMA32 = (
    '<|start_header_id|>assistant<|end_header_id|>{{- \'"parameters": \' }}'
    "{{- tool_call.arguments | tojson }}"
)
MISTRAL = "{%- if message.tool_calls %}{{- '[TOOL_CALLS] [' }}{%- for tool_call in message.tool_calls %}"


def test_detect_from_template(tokenizer: Any) -> None:
    assert detect_tool_parser(QWEN) == "hermes"
    assert detect_tool_parser(LLAMA31) == "llama3"
    assert detect_tool_parser(LLAMA32) == "llama3"
    assert detect_tool_parser(MISTRAL) == "mistral"
    assert detect_tool_parser(tokenizer.chat_template) is None  # SmolLM2 writes no tool calls
    for name in ("hermes", "llama3", "mistral"):
        assert detect_tool_parser(name) is None
