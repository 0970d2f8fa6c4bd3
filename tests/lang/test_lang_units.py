"""Pieces of the language that need no model: template cutting, choice methods, the prefix tracer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import radixserve.lang as sgl
from radixserve.lang.backend import ChoiceLogprobs
from radixserve.lang.chat_template import PLAIN, ChatTemplate, template_from_renderer, template_from_tokenizer
from radixserve.lang.choices import decide
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


def toks(*rows: list[float]) -> list[list[tuple[float, int, str | None]]]:
    return [[(lp, i, None) for i, lp in enumerate(r)] for r in rows]


def test_choice_methods() -> None:
    rows = toks([-1.0, -3.0], [-1.5], [-0.5, -9.0])
    d = decide(sgl.token_length_normalized, ["a", "b", "c"], rows, None)
    assert d.decision == "b" and d.meta_info["normalized_prompt_logprobs"] == [-2.0, -1.5, -4.75]
    # Greedy: the best first token wins (c's -0.5), whatever comes after.
    assert decide(sgl.greedy_token_selection, ["a", "b", "c"], rows, None).decision == "c"
    # Ties at the first token go on to the second (b padded with its mean).
    tie = toks([-1.0, -2.0], [-1.0])
    assert decide(sgl.greedy_token_selection, ["a", "b"], tie, None).decision == "b"
    # Unconditional: the choice the prompt helps most (mean of conditional - unconditional).
    u = toks([-2.0, -2.0], [-1.0, -1.0])
    d = decide(sgl.unconditional_likelihood_normalized, ["x", "y"], u, toks([-5.0, -8.0], [-1.0, -1.0]))
    assert d.decision == "x" and d.meta_info["normalized_unconditional_prompt_logprobs"] == [4.5, 0.0]
    with pytest.raises(ValueError, match="needs unconditional"):
        decide(sgl.unconditional_likelihood_normalized, ["x"], toks([-1.0]), None)
    with pytest.raises(ValueError, match="1 unconditional logprobs for 2 tokens"):
        decide(sgl.unconditional_likelihood_normalized, ["x"], toks([-1.0, -2.0]), toks([0.0]))


def test_select_refuses_what_is_not_a_choices_method() -> None:
    with pytest.raises(TypeError, match="choices_method"):
        sgl.select("x", ["a", "b"], choices_method=max)  # type: ignore[arg-type]


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


class EchoBackend(sgl.Backend):
    """A backend of our own on a loop of its own: generate echoes, or hangs when told to."""

    def __init__(self, loop: asyncio.AbstractEventLoop, hang: bool = False) -> None:
        self._loop, self.hang, self.prompts = loop, hang, []  # type: ignore[var-annotated]

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def chat_template(self) -> ChatTemplate:
        return PLAIN

    async def generate(self, prompt: str, params: sgl.GenParams) -> list[sgl.GenResult]:
        self.prompts.append(prompt)
        if self.hang:
            await asyncio.Event().wait()
        return [sgl.GenResult(f"<{len(prompt)}>", {"prompt_tokens": len(prompt)})] * params.n

    async def stream(self, prompt: str, params: sgl.GenParams) -> AsyncIterator[sgl.StreamChunk]:
        yield sgl.StreamChunk("x", True, {})

    async def score_choices(self, prefix: str, choices: Sequence[str], unconditional: bool = False) -> Any:
        return [ChoiceLogprobs([(-float(len(c)), 0, c)]) for c in choices]

    async def cache_prefix(self, prefix: str) -> dict[str, Any]:
        return {}

    async def flush_cache(self) -> bool:
        return True


def loop_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    return loop, t


def test_a_backend_of_ones_own() -> None:
    loop, t = loop_thread()
    be = EchoBackend(loop)

    @sgl.function
    def prog(s: Any) -> None:
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a") + sgl.select("b", ["long one", "short"]))

    st = prog.run(backend=be)
    assert st["a"] == f"<{len(PLAIN.prefix('user', True) + 'hi' + PLAIN.suffix('user') + 'Assistant: ')}>"
    assert st["b"] == "short" and st.messages()[-1]["content"] == st["a"] + "short"
    loop.call_soon_threadsafe(loop.stop)
    t.join()


def test_a_loop_that_stops_under_a_program_fails_it_instead_of_hanging() -> None:
    loop, t = loop_thread()
    be = EchoBackend(loop, hang=True)

    @sgl.function
    def prog(s: Any) -> None:
        s += "x" + sgl.gen("a")
        s += s["a"]

    result: list[BaseException] = []

    def run() -> None:
        try:
            prog.run(backend=be)
        except BaseException as e:
            result.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    while not be.prompts:
        time.sleep(0.05)
    loop.call_soon_threadsafe(loop.stop)
    t.join()
    runner.join(timeout=30)
    assert not runner.is_alive() and result and "stopped" in str(result[0])
