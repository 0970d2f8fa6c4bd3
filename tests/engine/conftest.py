"""Shared fixtures for engine tests: prompts and transformers' references (the transformers twin
`hf_model` and `tokenizer` are session fixtures of tests/conftest.py).

Correctness is defined by transformers: references come from `model.generate`
(greedy, one prompt at a time, no padding) on the same converted weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig

MODEL = "smollm2-135m-instruct"

_TEXT = (
    "The history of the radix tree goes back to the sixties, when Donald Morrison described PATRICIA, "
    "a practical algorithm to retrieve information coded in alphanumeric. Since then the structure has "
    "been used in routers, in databases, in compilers and now in the serving of large language models, "
    "where every prompt that shares a prefix with an earlier one can skip the work that was already done. "
    "Engineers like it because it is simple, because it is fast, and because it makes the cache obvious."
)
_WORDS = _TEXT.split()

_CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in one sentence what a hash table is.",
    "List three colors.",
    "How do I reverse a list in Python?",
    "Tell me a fun fact about octopuses.",
    "What is 12 times 12?",
    "Give me a synonym for happy.",
]


def make_prompts(tokenizer: Any) -> list[list[int]]:
    """32 prompts of mixed lengths (raw text of 3..80 words, and chat-templated questions)."""
    prompts: list[list[int]] = []
    for i in range(24):
        n = 3 + (i * 37) % 78
        start = (i * 11) % 20
        text = " ".join(_WORDS[start : start + n])
        prompts.append(tokenizer.encode(text))
    for q in _CHATS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


@pytest.fixture(scope="session")
def prompts(tokenizer: Any) -> list[list[int]]:
    return make_prompts(tokenizer)


def hf_greedy(model: Any, ids: list[int], max_new_tokens: int, **kw: Any) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=2, **kw
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="session")
def reference(hf_model: Any, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy 24 tokens for each prompt (stops at EOS like the engine)."""
    return [hf_greedy(hf_model, p, 24) for p in prompts]


def run(coro_fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    return asyncio.run(coro_fn(*args))


def engine_config(**kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(model=MODEL, device="cpu", dtype="float32")
    base.update(kw)
    return EngineConfig(**base)


async def with_engine(cfg: EngineConfig, body: Callable[[AsyncEngine], Coroutine[Any, Any, Any]]) -> Any:
    async with AsyncEngine(cfg) as engine:
        result = await body(engine)
        await engine.check_integrity()
        return result
