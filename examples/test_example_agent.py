"""An agent test on a real model, with radixserve's pytest plugin.

    pytest examples/test_example_agent.py -p radixserve.testing

(`-p radixserve.testing` is only needed while radixserve is not installed
with its `pytest11` entry point.) The `radixserve_engine` fixture is one
engine per model for the whole session, on the CPU in float32 and greedy via
`radixserve_params`, so answers are reproducible and equal to transformers'.
Pick the model in pytest.ini / pyproject (`radixserve_model = path/to/model`)
or per test or module with `@pytest.mark.radixserve(model="...")`.

The agent under test labels book reviews with the embedded SmolLM2-135M. A
135M model words its answer freely, so the agent parses it; the tests pin the
agent's behaviour (labels, concurrency, reproducibility), not the exact text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable

import pytest

from radixserve import AsyncEngine, Engine, RequestOutput, SamplingParams

REVIEWS = {
    "I loved this book, the story was wonderful!": "positive",
    "Terrible print quality, the pages fell out.": "negative",
    "Absolutely brilliant, I could not put it down.": "positive",
}


def review_prompt(review: str) -> list[dict[str, str]]:
    question = (
        f"Classify the sentiment of this review as positive or negative: '{review}' Answer with one word."
    )
    return [{"role": "user", "content": question}]


def parse_label(answer: str) -> str:
    """The agent's parser: the first label word in the answer, else "unknown"."""
    found = re.search(r"\b(positive|negative)\b", answer.lower())
    return found.group(1) if found else "unknown"


def label_review(engine: Engine, review: str, params: SamplingParams) -> str:
    out = engine.complete(review_prompt(review), params)
    assert isinstance(out, RequestOutput)
    return parse_label(out.text)


async def label_reviews(engine: AsyncEngine, reviews: list[str], params: SamplingParams) -> list[str]:
    """The async version of the agent: all reviews at once, batched by the engine."""
    outs = await asyncio.gather(*(engine.complete(review_prompt(r), params) for r in reviews))
    return [parse_label(o.text) for o in outs if isinstance(o, RequestOutput)]


@pytest.fixture
def params(radixserve_params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(radixserve_params, max_tokens=12)  # a label needs few tokens


@pytest.mark.parametrize(("review", "label"), REVIEWS.items())
def test_agent_labels_a_review(
    radixserve_engine: Engine, params: SamplingParams, review: str, label: str
) -> None:
    assert label_review(radixserve_engine, review, params) == label


def test_async_agent_labels_all_reviews_concurrently(
    radixserve_run: Callable[..., list[str]], params: SamplingParams
) -> None:
    labels = radixserve_run(lambda engine: label_reviews(engine, list(REVIEWS), params))
    assert labels == list(REVIEWS.values())


def test_greedy_answers_repeat_and_come_from_the_cache(
    radixserve_engine: Engine, params: SamplingParams
) -> None:
    prompt = review_prompt("Fast delivery and a great price, very happy.")
    first, again = (radixserve_engine.complete(prompt, params) for _ in range(2))
    assert isinstance(first, RequestOutput) and isinstance(again, RequestOutput)
    assert again.text == first.text
    # The first request's prompt (and answer) stayed in the radix cache: only the last token is recomputed.
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
