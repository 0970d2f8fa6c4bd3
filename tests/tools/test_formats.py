"""Fixed outputs of each format: several calls, text around them, malformed calls as content."""

from __future__ import annotations

import json
import re

import pytest

from radixserve.tools import FunctionSpec, ToolCall, tool_parser
from tools.helpers import calls_of, stream_deltas, streamed

A = '{"city": "Paris"}'
CASES = [
    # (parser, output, content, calls)
    ("hermes", "no calls here", "no calls here", []),
    (
        "hermes",
        'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Let me check.",
        [("get_weather", A)],
    ),
    (
        "hermes",  # Hermes without newlines, two calls, "parameters" read too
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"x": [1, {"y": null}]}}</tool_call>',
        "",
        [("a", "{}"), ("b", '{"x": [1, {"y": null}]}')],
    ),
    (
        "hermes",  # text between and after: joined by the whitespace before the calls
        'First.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b"}\n</tool_call>\n\nThen.',
        "First.\nThen.",
        [("a", "{}"), ("b", "{}")],
    ),
    (
        "hermes",  # raw control characters in strings (a bounded string of a structural tag allows them)
        '<tool_call>\n{"name": "a", "arguments": {\t"k"\t:\t"x\ty"}}\n</tool_call>',
        "",
        [("a", '{"k": "x\\ty"}')],
    ),
    (
        "hermes",  # arguments written as a JSON string
        '<tool_call>{"name": "a", "arguments": "{\\"k\\": \\"v\\"}"}</tool_call>',
        "",
        [("a", '{"k": "v"}')],
    ),
    (
        "hermes",  # malformed JSON stays content; the valid call after it is a call
        'x <tool_call>{"name": "a", "arguments": {</tool_call> '
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
        'x <tool_call>{"name": "a", "arguments": {</tool_call>',
        [("b", "{}")],
    ),
    ("hermes", '<tool_call>{"name": "a", "arguments": {}, "extra": 1}</tool_call>',
     '<tool_call>{"name": "a", "arguments": {}, "extra": 1}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "a b", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "a b", "arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "a", "arguments": [1]}</tool_call>', []),
    # the output ends inside a call: complete JSON is a call, incomplete is content
    ("hermes", 'Hi <tool_call>\n{"name": "a", "arguments": {}}\n', "Hi", [("a", "{}")]),
    ("hermes", 'Hi <tool_call>\n{"name": "a", "argu', 'Hi <tool_call>\n{"name": "a", "argu', []),
    ("hermes", "a <tool_ b", "a <tool_ b", []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", A)]),
    (
        "llama3",
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"n": 1}};{"name": "c"}',
        "",
        [("a", "{}"), ("b", '{"n": 1}'), ("c", "{}")],
    ),
    ("llama3", 'Sure: { "name": "a", "parameters": {"s": "}{"}}', "Sure:", [("a", '{"s": "}{"}')]),
    # JSON that is not a call (other keys) stays content, as does Llama's code interpreter
    ("llama3", 'Data: {"name": "Bob", "age": 3}.', 'Data: {"name": "Bob", "age": 3}.', []),
    ("llama3", "<|python_tag|>print(1)", "<|python_tag|>print(1)", []),
    ("llama3", '<|python_tag|>{"name": "a", "parameters": {', '<|python_tag|>{"name": "a", "parameters": {',
     []),
    (
        "mistral",
        'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "b", "arguments": {}}]',
        "Checking.",
        [("get_weather", A), ("b", "{}")],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]b[ARGS] {}',
        "",
        [("get_weather", A), ("b", "{}")],
    ),
    ("mistral", '[TOOL_CALLS]{"name": "a", "arguments": {}}', "", [("a", "{}")]),
    # one bad item: the whole array is content
    ("mistral", '[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"nam": "b"}]',
     '[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"nam": "b"}]', []),
    ("mistral", "[TOOL_CALLS]a b", "[TOOL_CALLS]a b", []),
    ("mistral", "[TOOL_CALLS]a[ARGS][1]", "[TOOL_CALLS]a[ARGS][1]", []),
    ("mistral", '[TOOL_CALLS] [{"name": "a"}', '[TOOL_CALLS] [{"name": "a"}', []),
]


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_fixed_outputs(name: str, text: str, content: str, calls: list[tuple[str, str]]) -> None:
    parser = tool_parser(name)
    parsed = parser.parse(text)
    assert (parsed.content, calls_of(parsed)) == (content, calls)
    one_char = streamed(parser, text)  # one character a piece: every marker split
    assert (one_char.content, calls_of(one_char)) == (content, calls)


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_only_known_functions_are_calls(name: str) -> None:
    parser = tool_parser(name, tools=[FunctionSpec("a")])
    calls = [ToolCall("call_0", "a", "{}"), ToolCall("call_1", "b", "{}")]
    assert calls_of(parser.parse(parser.write_call(calls[0]))) == [("a", "{}")]
    other = parser.write_call(calls[1])
    assert parser.parse(other).content == other
    assert calls_of(tool_parser(name).parse(other)) == [("b", "{}")]


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_written_calls_read_back(name: str) -> None:
    parser = tool_parser(name)
    calls = [
        ToolCall(
            "call_0",
            "get_weather",
            json.dumps({"city": "Zürich", "q": '"<tool_call>[TOOL_CALLS]'}, ensure_ascii=False),
        ),
        ToolCall("call_1", "now", "{}"),
    ]
    parsed = parser.parse(parser.write_calls(calls))
    assert parsed.content == ""
    assert calls_of(parsed) == [(c.name, c.arguments) for c in calls]


def test_stream_deltas_are_openai_shaped() -> None:
    parser = tool_parser("hermes")
    text = 'Hi <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
    text += '<tool_call>{"name": "b"}</tool_call>'
    deltas = stream_deltas(parser, [text[:20], text[20:60], text[60:]])
    calls = [c for d in deltas for c in d.tool_calls]
    assert [(c.index, c.name, c.arguments) for c in calls] == [
        (0, "a", ""), (0, None, '{"x": 1}'), (1, "b", ""), (1, None, "{}"),
    ]
    assert [c.id is not None for c in calls] == [True, False, True, False]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls if c.id is not None)
    assert deltas[0].content == "Hi" and not deltas[0].tool_calls  # sent before the call completes


def test_stream_holds_back_only_what_may_be_markup() -> None:
    s = tool_parser("hermes").stream()
    assert s.feed("Hello <tool").content == "Hello"  # " <tool" may open a call
    assert s.feed("s are nice").content == " <tools are nice"
    assert s.feed("\n\n").content == ""  # trailing whitespace waits: a call may follow
    assert s.finish().content == "\n\n"
    with pytest.raises(RuntimeError):
        s.feed("x")


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_deeply_nested_arguments_are_content_not_a_crash(name: str) -> None:
    parser = tool_parser(name)
    deep = "[" * 100_000 + "]" * 100_000
    text = parser.write_call(ToolCall("call_0", "a", '{"x": ' + deep + "}"))
    parsed = parser.parse(text)
    assert parsed.tool_calls == () and parsed.content == text


def test_a_raw_control_character_in_a_string_is_read_and_escaped() -> None:
    """xgrammar's length-bounded JSON string lets a raw control character through a constrained
    call (seen on the H200 with random weights): the call still parses, and its arguments are
    valid JSON text again."""
    text = '<tool_call>\n{"name": "f", "arguments": {"city": "a\x05b",\t"days":3\r}}\n</tool_call>'
    parsed = tool_parser("hermes").parse(text)
    assert parsed.content == ""
    assert [c.name for c in parsed.tool_calls] == ["f"]
    assert json.loads(parsed.tool_calls[0].arguments) == {"city": "a\x05b", "days": 3}
    assert "\x05" not in parsed.tool_calls[0].arguments
