"""Every way of cutting an output into stream pieces gives what `parse` gives; with valid calls
and markup-free text around them, that is the calls and the text, and no markup in content."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.tools import ToolCall, ToolParser, tool_parser
from tools.helpers import calls_of, cut, streamed

PARSERS = ["hermes", "llama3", "mistral"]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces of text that look like markup without being a whole marker, and their neighbours.
SNIPPETS = [
    "a", "Hi", " ", "\n", "\t", ";", ":", ",", "é", "\\", '"', "<", ">", "/", "|", "{", "}", "[", "]",
    "<tool", "_call", "</tool_call>", "<tool_call", "<|python", "_tag|", "name", '"name"', "TOOL",
    "[TOOL_CALLS", "_CALLS]", "[ARGS]",
]
# Whole markers and call bodies, good and bad, for outputs with anything in them.
MARKUP = [
    "<tool_call>", "</tool_call>", "<|python_tag|>", '{"name"', '{ "name"', "[TOOL_CALLS]", "[ARGS]",
    '{"name": "f", "arguments": {"a": 1}}', '{"name": "g", "parameters": {}}', '"arguments": ',
    '[{"name": "f"}]', "f[ARGS]{}", "}", "{", '{"x": "}"}',
]
MARKERS = {"hermes": ["<tool_call>"], "llama3": ["<|python_tag|>", '{"name"', '{ "name"'],
           "mistral": ["[TOOL_CALLS]"]}

json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(
    st.sampled_from(list('ab "\\{}[]<>/é\n')), max_size=8
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text("xyz", max_size=3), inner, max_size=3),
    max_leaves=8,
)
calls = st.builds(
    lambda name, args: ToolCall("call_0", name, json.dumps(args, ensure_ascii=False)),
    st.sampled_from(["get_weather", "now", "a.b-c_1"]),
    st.dictionaries(st.text("kvw", min_size=1, max_size=4), json_values, max_size=3),
)
texts = st.lists(st.sampled_from(SNIPPETS), max_size=8).map("".join)


def expected_content(parser: ToolParser, parts: list[str | ToolCall]) -> str:
    """The content rules, written out: whitespace touching a call (and separators after it) is
    dropped; between two pieces of content the whitespace before the calls joins them."""
    out = ""
    join: str | None = None  # calls since the last content: the whitespace before them
    for part in parts:
        if isinstance(part, ToolCall):
            if join is None:
                join = out[len(out.rstrip()):] if out.strip() else ""
                out = out.rstrip()
            continue
        if join is not None:
            part = part.lstrip(" \t\r\n" + parser.separators)
            if not part:
                continue
            out += join if out else ""
            join = None
        out += part
    return out if join is None else out.rstrip()


@pytest.mark.parametrize("name", PARSERS)
@given(data=st.data())
@SETTINGS
def test_calls_among_text_any_cut(name: str, data: st.DataObject) -> None:
    parser = tool_parser(name)
    parts: list[str | ToolCall] = data.draw(st.lists(texts | calls, max_size=6))
    text = "".join(parser.write_call(p) if isinstance(p, ToolCall) else p for p in parts)
    n_calls = sum(isinstance(p, ToolCall) for p in parts)
    want_calls = [(p.name, p.arguments) for p in parts if isinstance(p, ToolCall)]
    # Text pieces never hold a whole marker (nor build one with their neighbours).
    if sum(text.count(m) for m in MARKERS[name]) != n_calls:  # one marker a written call
        return
    parsed = parser.parse(text)
    assert calls_of(parsed) == want_calls
    assert parsed.content == expected_content(parser, parts)
    pieces = cut(text, data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    again = streamed(parser, pieces)
    assert (again.content, calls_of(again)) == (parsed.content, want_calls)


@pytest.mark.parametrize("name", PARSERS)
@given(data=st.data())
@SETTINGS
def test_any_output_any_cut(name: str, data: st.DataObject) -> None:
    """Outputs with markup anywhere, malformed calls included: streaming still gives `parse`'s
    answer, and an output with no call is all content, verbatim."""
    parser = tool_parser(name)
    text = "".join(data.draw(st.lists(st.sampled_from(SNIPPETS + MARKUP), max_size=14)))
    parsed = parser.parse(text)
    if not parsed.tool_calls:
        assert parsed.content == text
    pieces = cut(text, data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    again = streamed(parser, pieces)
    assert (again.content, calls_of(again)) == (parsed.content, calls_of(parsed))


@pytest.mark.parametrize("name", PARSERS)
@given(text=st.text(max_size=40))
@SETTINGS
def test_never_raises(name: str, text: str) -> None:
    parsed = tool_parser(name).parse(text)
    assert parsed.content == text or parsed.tool_calls
