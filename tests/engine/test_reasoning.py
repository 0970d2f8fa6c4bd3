"""Reasoning blocks split off through the public API: the engine's outputs (whole and streamed)
and the chat route's `reasoning_content`, on the embedded model with `reasoning_parser="qwen3"`
and a regex that makes it write a `<think>` block; "auto" picks the parser from the template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.chat_plan import ChatParsers
from radixserve.server import create_app, inprocess_async_openai

from .conftest import MODEL

THINKING = r"<think>\n[a-z]+( [a-z]+){2,5}\n</think>\n\n[A-Z][a-z]+( [a-z]+){1,3}\."
MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
TEMPLATES = json.loads((Path(__file__).parents[1] / "model" / "data" / "chat_templates.json").read_text())


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=64, temperature=0, regex=THINKING)


def test_reasoning_in_outputs_streams_and_http() -> None:
    async def body() -> None:
        async with AsyncEngine(EngineConfig(model=MODEL, device="cpu", reasoning_parser="qwen3")) as engine:
            raw = await engine.complete("Hello", SamplingParams(max_tokens=1))
            assert raw.reasoning_text is None  # a text prompt is not a chat: nothing is parsed
            out = await engine.complete(MESSAGES, _params())
            assert out.finish_reason == "stop"
            whole = engine.tokenizer.decode(list(out.token_ids), skip_special_tokens=True)
            assert whole.startswith("<think>\n")
            reasoning, content = whole[len("<think>\n") :].split("\n</think>\n\n")
            assert out.reasoning_text == reasoning and out.text == content
            streamed = [o async for o in engine.generate(MESSAGES, _params())]
            assert "".join(o.delta_reasoning_text for o in streamed) == reasoning
            assert "".join(o.delta_text for o in streamed) == content
            assert all("<think>" not in o.delta_text and "</think>" not in o.delta_text for o in streamed)

            async with inprocess_async_openai(create_app(engine)) as client:
                reply = await client.chat.completions.create(
                    model=MODEL,
                    messages=MESSAGES,
                    max_tokens=64,
                    temperature=0,
                    extra_body={"regex": THINKING},
                )
                message = reply.choices[0].message
                assert message.content == content
                assert (
                    message.model_extra is not None and message.model_extra["reasoning_content"] == reasoning
                )
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=MESSAGES,
                    max_tokens=64,
                    temperature=0,
                    stream=True,
                    extra_body={"regex": THINKING},
                )
                pieces = {"reasoning": "", "content": ""}
                async for chunk in stream:
                    for c in chunk.choices:
                        pieces["content"] += c.delta.content or ""
                        extra = c.delta.model_extra or {}
                        pieces["reasoning"] += extra.get("reasoning_content") or ""
                assert pieces == {"reasoning": reasoning, "content": content}

    asyncio.run(asyncio.wait_for(body(), 240))


@pytest.mark.parametrize(
    ("template", "tool", "reasoning"),
    [
        ("Qwen/Qwen3", "hermes", "qwen3"),
        ("Qwen/Qwen2.5-Instruct", "hermes", None),
        ("meta-llama/Llama-3.2-Instruct", "llama3", None),
        ("mistralai/Mistral-Nemo-Instruct-2407", "mistral", None),
    ],
)
def test_auto_parsers_read_the_template(
    template: str, tool: str, reasoning: str | None, tokenizer: Any
) -> None:
    class WithTemplate:
        chat_template = TEMPLATES[template]

    assert ChatParsers.resolve("auto", "auto", WithTemplate()) == ChatParsers(tool, reasoning)
    assert ChatParsers.resolve("auto", "auto", tokenizer) == ChatParsers("hermes", None)  # the embedded model
    with pytest.raises(ValueError, match="not one of"):
        ChatParsers.resolve("nope", None, tokenizer)
