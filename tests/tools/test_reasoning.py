"""`<think>` blocks: Qwen3 (the model opens the block) and DeepSeek-R1 (the prompt opens it)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.tools import ReasoningParser, ReasoningSplit, detect_reasoning_parser, reasoning_parser
from tools.helpers import cut


def streamed(parser: ReasoningParser, pieces: list[str]) -> ReasoningSplit:
    s = parser.stream()
    out = [*(s.feed(p) for p in pieces), s.finish()]
    return ReasoningSplit("".join(d.reasoning for d in out), "".join(d.content for d in out))


CASES = [
    ("qwen3", "<think>\nLet me think.\n</think>\n\nIt is 4.", "Let me think.", "It is 4."),
    ("qwen3", "It is 4.", "", "It is 4."),
    ("qwen3", "  It is <think>4</think>.", "", "  It is <think>4</think>."),  # only at the start
    ("qwen3", "\n<think></think>\n\nIt is 4.", "", "It is 4."),
    ("qwen3", "<think>\nStill thinking", "Still thinking", ""),  # ended inside: all reasoning
    ("qwen3", "<thi", "", "<thi"),
    ("deepseek-r1", "Let me think.\n</think>\n\nIt is 4.", "Let me think.", "It is 4."),
    ("deepseek-r1", "<think>\nHm.</think>Four.", "Hm.", "Four."),  # the model repeats the tag
    ("deepseek-r1", "Hm, 2 + 2 </thi", "Hm, 2 + 2 </thi", ""),
]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_fixed_outputs(name: str, text: str, reasoning: str, content: str) -> None:
    parser = reasoning_parser(name)
    assert parser.parse(text) == ReasoningSplit(reasoning, content)
    assert streamed(parser, list(text)) == ReasoningSplit(reasoning, content)


def test_prompt_decides_whether_the_output_starts_inside() -> None:
    opened = "<|im_start|>assistant\n<think>\n"
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert reasoning_parser("qwen3", prompt=opened).parse("Hm.</think>4") == ReasoningSplit("Hm.", "4")
    off = reasoning_parser("qwen3", prompt=closed)
    assert off.parse("Hm.</think>4") == ReasoningSplit("", "Hm.</think>4")
    # DeepSeek-R1's older template leaves `<think>` to the model: its output starts inside anyway
    assert reasoning_parser("deepseek-r1", prompt="User: hi\n").parse("4") == ReasoningSplit("4", "")


def test_detect_from_template(tokenizer: Any) -> None:
    qwen3 = "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>"
    r1 = "{{'<｜Assistant｜>'}}{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
    assert detect_reasoning_parser(qwen3) == "qwen3"
    assert detect_reasoning_parser(r1) == "deepseek-r1"
    assert detect_reasoning_parser(tokenizer.chat_template) is None


def test_stream_pieces() -> None:
    s = reasoning_parser("qwen3").stream()
    assert s.feed("<thi") == ReasoningSplit()
    assert s.feed("nk>\nStep one. ") == ReasoningSplit("Step one.", "")  # trailing space waits
    assert s.feed("Two.</th") == ReasoningSplit(" Two.", "")  # a possible end tag waits
    assert s.feed("ink>\n\n") == ReasoningSplit()
    assert s.feed("Four.") == ReasoningSplit("", "Four.")
    assert s.finish() == ReasoningSplit()


SNIPPETS = ["<think>", "</think>", "<th", "ink>", "</", "a", "Hi", " ", "\n", "<", ">"]


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1"])
@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_any_cut_gives_parse(name: str, data: st.DataObject) -> None:
    parser = reasoning_parser(name)
    text = "".join(data.draw(st.lists(st.sampled_from(SNIPPETS), max_size=12)))
    pieces = cut(text, data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    assert streamed(parser, pieces) == parser.parse(text)


@given(reasoning=st.text("ab \n<>/", max_size=12), content=st.text("cd \n<>", max_size=12))
@settings(max_examples=150, deadline=None)
def test_block_then_answer(reasoning: str, content: str) -> None:
    """A block without its tags inside splits into its text and the answer, both stripped as
    documented (reasoning of surrounding whitespace, content of the leading whitespace)."""
    if "</think>" in reasoning:
        return
    got = reasoning_parser("qwen3").parse(f"<think>{reasoning}</think>{content}")
    assert got == ReasoningSplit(reasoning.strip(), content.lstrip())
