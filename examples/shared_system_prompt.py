"""A batch of 16 questions behind one long system prompt, through `generate_many`.

    python examples/shared_system_prompt.py [--max-tokens 32] [--model PATH]

Every request starts with the same ~250-token system prompt. The radix cache
should compute it once: the scheduler holds back requests that share an
uncomputed prefix with one being prefilled, then serves the prefix from the
tree. Per request it prints `usage.cached_tokens`, then the overall hit rate
(cached / prompt tokens) against the best possible (every distinct prompt
token computed once: the system prompt, and the start of questions that
begin alike).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any

from radixserve import AsyncEngine, EngineConfig, RequestOutput, SamplingParams

SYSTEM = (
    "You are the support assistant of Northwind Books, an online bookstore. "
    "Answer in one or two short sentences, politely and without inventing facts. "
    "Store policies: orders ship within two business days from our warehouse in Leeds; "
    "standard delivery takes three to five days in the United Kingdom and seven to twelve "
    "days elsewhere; express delivery takes one to two days and costs 6 pounds. "
    "Returns are accepted within 30 days for unread books in their original condition; "
    "the customer pays return shipping unless the book arrived damaged. "
    "Gift cards never expire and can be used on e-books and audiobooks. "
    "Members of the Northwind Reading Club get free standard delivery, a 10 percent "
    "discount on new releases and early access to signed editions. "
    "Our customer service team works Monday to Friday, 9 am to 6 pm UK time. "
    "If a question is not about books, orders or the store, say that you can only help "
    "with the bookstore, and suggest where the customer could look instead."
)

QUESTIONS = [
    "How long does delivery to France take?",
    "Can I return a book I have already read?",
    "Do gift cards expire?",
    "What does the reading club cost and give me?",
    "Is express delivery available?",
    "My book arrived damaged. What now?",
    "When is customer service open?",
    "Can I use a gift card for audiobooks?",
    "Where do you ship from?",
    "Do members pay for standard delivery?",
    "Can you recommend a good pizza place?",
    "How fast do orders leave the warehouse?",
    "Who pays return shipping?",
    "Do you sell signed editions?",
    "How long is the return window?",
    "How long does standard delivery take in the UK?",
]


@dataclass(frozen=True)
class Report:
    outputs: list[RequestOutput]
    hit_rate: float  # cached prompt tokens / prompt tokens
    best_hit_rate: float  # if every distinct prompt token were computed once


async def main(max_tokens: int = 32, model: str = "smollm2-135m-instruct", device: str = "auto") -> Report:
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS
    ]
    async with AsyncEngine(EngineConfig(model=model, device=device)) as engine:
        results = await engine.generate_many(
            conversations, SamplingParams(temperature=0, max_tokens=max_tokens)
        )
        best = _best_cached([_chat_ids(engine.tokenizer, c) for c in conversations])
    outputs = [r for r in results if isinstance(r, RequestOutput)]  # n=1: one output each
    for question, out in zip(QUESTIONS, outputs):
        u = out.usage
        print(f"[{u.cached_tokens:4d}/{u.prompt_tokens} cached] {question} -> {out.text.strip()!r}")
    prompt = sum(o.usage.prompt_tokens for o in outputs)
    report = Report(
        outputs,
        hit_rate=sum(o.usage.cached_tokens for o in outputs) / prompt,
        best_hit_rate=best / prompt,
    )
    print(f"hit rate {report.hit_rate:.1%} (best possible {report.best_hit_rate:.1%})")
    return report


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt token ids the engine makes of chat messages (template, no extra BOS)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _best_cached(prompts: list[list[int]]) -> int:
    """Prompt tokens a perfect cache serves: all but the distinct ones (the nodes of their trie).

    Sorted, each prompt shares its longest common prefix with a neighbour.
    """
    ordered = sorted(prompts)
    return sum(_common_prefix_len(a, b) for a, b in zip(ordered, ordered[1:]))


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--max-tokens", type=int, default=32)
    cli.add_argument("--model", default="smollm2-135m-instruct")
    cli.add_argument("--device", default="auto")
    args = cli.parse_args()
    asyncio.run(main(args.max_tokens, args.model, args.device))
