"""Chat prompts with OpenAI-style tools and tool turns (`radixserve.prompts.render_chat`,
`tokenize_prompt`) equal transformers' `apply_chat_template(messages, tools=...)` on published
templates (Qwen2.5, Qwen3, Llama-3.1, Llama-3.2, Mistral Nemo), errors included; bad fields
are a ValueError naming them; a template without tool support (the embedded SmolLM2's) gets
the default Hermes tool prompt; and the engine renders tool turns the same way."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from radixserve.blocking import Engine
from radixserve.model.embedded import embedded_model_dir
from radixserve.model.tokenizer import load_tokenizer
from radixserve.model.tool_prompt import TOOLS_FOOTER, TOOLS_HEADER
from radixserve.prompts import render_chat, tokenize_prompt
from radixserve.sampling_params import SamplingParams

TEMPLATES = json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text())
WITH_TOOLS = [
    "Qwen/Qwen2.5-Instruct",
    "Qwen/Qwen3",
    "meta-llama/Llama-3.1-Instruct",
    "meta-llama/Llama-3.2-Instruct",
    "mistralai/Mistral-Nemo-Instruct-2407",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, TIME]
SYSTEM = {"role": "system", "content": "You are a weather bot."}
USER = {"role": "user", "content": "What is the weather in Zürich?"}
USER2 = {"role": "user", "content": "And the time?"}


def call(ids: list[str], content: str | None = None) -> dict[str, Any]:
    """An assistant message with OpenAI-shaped tool calls (arguments a JSON string)."""
    fns = [("get_weather", '{"city": "Zürich"}'), ("get_time", "{}")]
    calls = [
        {"id": i, "type": "function", "function": {"name": fns[k][0], "arguments": fns[k][1]}}
        for k, i in enumerate(ids)
    ]
    return {"role": "assistant", "content": content, "tool_calls": calls}


def result(call_id: str, content: str = "Sunny, 21 °C") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


ANSWER = {"role": "assistant", "content": "It is sunny and 21 °C."}
# (messages, tools, chat_template_kwargs). Ids are 9 characters, as Mistral's template requires.
CASES: list[tuple[list[dict[str, Any]], Any, Any]] = [
    ([SYSTEM, USER], TOOLS, None),
    ([USER], TOOLS, {"enable_thinking": False}),
    ([SYSTEM, USER, call(["call12345"]), result("call12345")], TOOLS, None),
    ([USER, call(["call12345"], "Let me look."), result("call12345"), ANSWER, USER2], TOOLS, None),
    ([USER, call(["call12345"]), result("call12345")], TOOLS, {"enable_thinking": True}),
    # Two calls at once: Llama 3.x refuses them (its error is ours too).
    ([USER, call(["call12345", "call67890"]), result("call12345"), result("call67890", "1")], TOOLS, None),
    # Ids of other lengths: Mistral's template refuses them.
    ([USER, call(["call_0123456789"]), result("call_0123456789")], TOOLS, None),
    # Two user turns in a row: Mistral's template requires alternating roles.
    ([USER, USER2], TOOLS, None),
]


def as_transformers(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers documents them and vLLM passes them: tool call arguments
    as dicts, the null content of a tool-calling message as ""."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or ():
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            m["content"] = m["content"] or ""
    return out


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any]]:
    """For each template: ours (`load_tokenizer`) and transformers' tokenizer of the embedded
    model's tokenizer files with that chat_template.jinja."""
    from transformers import PreTrainedTokenizerFast

    source = embedded_model_dir()
    pairs = {}
    for name in [*WITH_TOOLS, "embedded"]:
        folder = tmp_path_factory.mktemp(name.replace("/", "_"))
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(source / f, folder / f)
        if name != "embedded":
            (folder / "chat_template.jinja").write_text(TEMPLATES[name], encoding="utf-8")
        pairs[name] = (load_tokenizer(folder), PreTrainedTokenizerFast.from_pretrained(str(folder)))
    return pairs


def _outcome(fn: Any, *args: Any, **kw: Any) -> tuple[str, str]:
    try:
        return "ok", str(fn(*args, **kw))
    except Exception as e:  # noqa: BLE001 - the outcome, error or text, is compared
        return type(e).__name__, str(e)


@pytest.mark.parametrize("name", WITH_TOOLS)
def test_tools_and_tool_turns_render_as_transformers(tokenizers: dict[str, Any], name: str) -> None:
    ours, ref = tokenizers[name]
    outcomes = []
    for messages, tools, kwargs in CASES:
        expected = _outcome(
            ref.apply_chat_template,
            as_transformers(messages),
            tools=tools,
            tokenize=False,
            add_generation_prompt=True,
            **(kwargs or {}),
        )
        got = _outcome(render_chat, ours, messages, tools=tools, chat_template_kwargs=kwargs)
        if expected[0] == "ok":
            assert got == expected, (name, messages)
            assert "get_weather" in got[1] and "get_time" in got[1]  # the tools are in the prompt
            for m in messages:  # user turns and tool results (Llama drops a tool caller's text)
                assert m["role"] not in ("user", "tool") or m["content"] in got[1]
            ids = tokenize_prompt(ours, messages, tools=tools, chat_template_kwargs=kwargs)
            assert ids == ref.encode(expected[1], add_special_tokens=False)
        else:  # the template's own error, as a ValueError that carries its message
            assert got[0] == "ValueError" and expected[1] in got[1], (name, messages, got, expected)
        outcomes.append(expected[0])
    assert outcomes[:5] == ["ok"] * 5, outcomes
    refused = {i for i, o in enumerate(outcomes) if o != "ok"}
    if name.startswith("mistralai"):
        assert refused == {6, 7}  # ids of 10+ characters, two user turns in a row
    elif name.startswith("meta-llama"):
        assert refused == {5}  # two calls at once
    else:
        assert refused == set()


def test_enable_thinking_reaches_the_template(tokenizers: dict[str, Any]) -> None:
    ours, _ = tokenizers["Qwen/Qwen3"]
    off = render_chat(ours, [USER], chat_template_kwargs={"enable_thinking": False})
    on = render_chat(ours, [USER], chat_template_kwargs={"enable_thinking": True})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")


def test_default_tool_prompt_for_a_template_without_tools(tokenizers: dict[str, Any]) -> None:
    ours, ref = tokenizers["embedded"]
    messages = [SYSTEM, USER, call(["c1", "c2"], "Checking."), result("c1"), result("c2", "12:00")]
    text = render_chat(ours, messages, tools=TOOLS)
    tools_text = TOOLS_HEADER + "".join("\n" + json.dumps(t) for t in TOOLS) + TOOLS_FOOTER
    assert text == (
        f"<|im_start|>system\nYou are a weather bot.\n\n{tools_text}<|im_end|>\n"
        "<|im_start|>user\nWhat is the weather in Zürich?<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nSunny, 21 °C\n</tool_response>\n"
        "<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # No system message: one is added for the tools (in place of the template's default one).
    assert render_chat(ours, [USER], tools=[TIME]).startswith(
        f"<|im_start|>system\n{TOOLS_HEADER}\n{json.dumps(TIME)}{TOOLS_FOOTER}<|im_end|>\n<|im_start|>user\n"
    )
    # Without tools or tool turns the template renders as it always did.
    plain = [SYSTEM, USER]
    expected = ref.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert render_chat(ours, plain) == expected


BAD: list[tuple[list[Any], Any, Any, str]] = [
    ([USER, result("call12345")], None, None, "messages[1].tool_call_id"),
    ([USER, call(["call12345"]), result("call99999")], None, None, "messages[2].tool_call_id"),
    ([USER, {"role": "tool", "content": "x"}], None, None, "messages[1].tool_call_id"),
    ([USER, {**ANSWER, "tool_call_id": "a"}], None, None, "messages[1].tool_call_id"),
    ([{**USER, "tool_calls": call(["a"])["tool_calls"]}], None, None, "messages[0].tool_calls"),
    ([USER, {**call(["a"]), "tool_calls": []}], None, None, "messages[1].tool_calls"),
    ([USER, {"role": "assistant", "content": None}], None, None, "messages[1].content"),
    ([USER, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}],
     None, None, "messages[1].tool_calls[0].id"),
    ([USER, {"role": "assistant", "tool_calls": [{"id": "a", "function": {"arguments": "{}"}}]}],
     None, None, "messages[1].tool_calls[0].function.name"),
    ([USER, {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{"}}]}],
     None, None, "messages[1].tool_calls[0].function.arguments"),
    ([USER, {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "1"}}]}],
     None, None, "messages[1].tool_calls[0].function.arguments"),
    ([USER], [{"type": "function", "function": {**WEATHER["function"], "parameters": "object"}}], None,
     "tools[0].function.parameters"),
    ([USER], [WEATHER, {"type": "function"}], None, "tools[1].function"),
    ([USER], [WEATHER, {"type": "retrieval", "function": {"name": "r"}}], None, "tools[1].type"),
    ([USER], [{"type": "function", "function": {"name": ""}}], None, "tools[0].function.name"),
    ([USER], "get_weather", None, "tools:"),
    ([USER], None, {"tools": []}, "chat_template_kwargs.tools"),
    ([USER], None, {"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
    ([USER], None, {"enable_thinking": object()}, "chat_template_kwargs.enable_thinking"),
    ([USER], None, ["enable_thinking"], "chat_template_kwargs="),
]  # fmt: skip


@pytest.mark.parametrize(("messages", "tools", "kwargs", "field"), BAD)
def test_bad_fields_are_named(
    tokenizers: dict[str, Any], messages: list[Any], tools: Any, kwargs: Any, field: str
) -> None:
    for name in ("Qwen/Qwen2.5-Instruct", "embedded"):  # the same checks with and without tool support
        with pytest.raises(ValueError, match="^" + re.escape(field)):
            tokenize_prompt(tokenizers[name][0], messages, tools=tools, chat_template_kwargs=kwargs)


def test_tools_need_chat_messages(tokenizers: dict[str, Any]) -> None:
    ours, _ = tokenizers["Qwen/Qwen2.5-Instruct"]
    for prompt in ("What is the weather?", [1, 2, 3]):
        with pytest.raises(ValueError, match="chat messages"):
            tokenize_prompt(ours, prompt, tools=TOOLS)
    with pytest.raises(ValueError, match="chat messages"):
        tokenize_prompt(ours, [1, 2, 3], chat_template_kwargs={"enable_thinking": False})


def test_the_engine_renders_tool_turns(tokenizers: dict[str, Any], radixserve_engine: Engine) -> None:
    """A conversation with tool turns through `Engine.complete` is the default tool prompt's
    rendering (prompt length and greedy output equal those of its token ids); a tool message
    that answers no call is the ValueError naming it."""
    ours, _ = tokenizers["embedded"]
    messages = [USER, call(["c1"]), result("c1")]
    ids = tokenize_prompt(ours, messages)
    assert "<tool_response>" in ours.decode(ids)
    params = SamplingParams(temperature=0, max_tokens=4)
    by_messages = radixserve_engine.complete(messages, params)
    by_ids = radixserve_engine.complete(ids, dataclasses.replace(params))
    assert by_messages.usage.prompt_tokens == len(ids)
    assert by_messages.token_ids == by_ids.token_ids
    with pytest.raises(ValueError, match=r"^messages\[1\]\.tool_call_id"):
        radixserve_engine.complete([USER, result("c1")], params)
