"""Pieces of the language that need no model: template cutting, choice methods, the prefix tracer."""

from __future__ import annotations

from typing import Any

import pytest

import radixserve.lang as sgl
from radixserve.lang.backend import ChoiceLogprobs
from radixserve.lang.chat_template import PLAIN, template_from_renderer, template_from_tokenizer
from radixserve.lang.prefix import common_prefix


def llama3(messages: list[dict[str, str]], gen: bool) -> str:
    out = "<|begin_of_text|>"
    for m in messages:
        out += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
    return out + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if gen else "")


def test_template_cut_from_a_renderer() -> None:
    t = template_from_renderer(llama3)
    assert t.prefix("user", first=False) == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert t.suffix("assistant") == "<|eot_id|>"
    assert t.prefix("system", first=True) == "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    assert t.prefix("user", first=True) == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    text = t.prefix("user", True) + "a" + t.suffix("user") + t.prefix("assistant", False) + "b"
    assert text + t.suffix("assistant") == llama3(msgs, False)
    with pytest.raises(ValueError, match="unknown role"):
        t.prefix("tool", first=False)


def test_templates_that_cannot_be_cut_fall_back_to_plain_labels() -> None:
    class NoSystem:
        chat_template = "x"

        def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> str:
            if messages[0]["role"] == "system":
                raise ValueError("system role not supported")
            return "".join(m["content"] for m in messages)

    assert template_from_tokenizer(NoSystem()) is PLAIN
    assert template_from_tokenizer(None) is PLAIN


def scored(*rows: list[float], uncond: list[list[float]] | None = None) -> list[ChoiceLogprobs]:
    return [
        ChoiceLogprobs(
            [(lp, i, None) for i, lp in enumerate(r)],
            None if uncond is None else [(lp, i, None) for i, lp in enumerate(uncond[k])],
        )
        for k, r in enumerate(rows)
    ]


def test_choice_methods() -> None:
    rows = scored([-1.0, -3.0], [-1.5], [-0.5, -9.0])
    d = sgl.token_length_normalized(["a", "b", "c"], rows)
    assert d.decision == "b" and d.meta_info["normalized_prompt_logprobs"] == [-2.0, -1.5, -4.75]
    # Greedy: the best first token wins (c's -0.5), whatever comes after.
    assert sgl.greedy_token_selection(["a", "b", "c"], rows).decision == "c"
    # Ties at the first token go on to the second (b padded with its mean).
    tie = scored([-1.0, -2.0], [-1.0])
    assert sgl.greedy_token_selection(["a", "b"], tie).decision == "b"
    # Unconditional: the choice the prompt helps most (mean of conditional - unconditional).
    u = scored([-2.0, -2.0], [-1.0, -1.0], uncond=[[-5.0, -8.0], [-1.0, -1.0]])
    d = sgl.unconditional_likelihood_normalized(["x", "y"], u)
    assert d.decision == "x" and d.meta_info["normalized_unconditional_prompt_logprobs"] == [4.5, 0.0]
    with pytest.raises(ValueError):
        sgl.unconditional_likelihood_normalized(["x"], scored([-1.0]))


def test_common_prefix_stops_at_the_first_call_and_at_arguments() -> None:
    shared = "Instructions that every program starts with, long enough to be worth caching.\n"

    def prog(s: Any, q: str) -> None:
        s += shared + "Q: " + q + "\n"
        s += "A:" + sgl.gen("a")
        s += "never reached"

    assert common_prefix(prog, [{"q": "one"}, {"q": "two"}], PLAIN) == shared
    assert common_prefix(prog, [{"q": "x"}], PLAIN) == shared + "Q: x\n"

    def short(s: Any, q: str) -> None:
        s += "Hi " + q + sgl.gen("a")

    assert common_prefix(short, [{"q": "a"}, {"q": "b"}], PLAIN) == ""
