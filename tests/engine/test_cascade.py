"""Shared-prefix (cascade) decode through the engine: greedy output equals transformers'.

Requests that share a long prefix (few-shot style, and `n > 1` completions of
one prompt) decode with the prefix read once per group; `stats()` counts the
steps that did. The threshold is lowered so that CPU-sized prompts qualify.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from radixserve import AsyncEngine, SamplingParams

from .conftest import engine_config, hf_greedy, run, with_engine

MAX = 8
SHARED = (
    "You are a careful assistant. Answer in one short sentence. Example: the sky is blue because "
    "air scatters blue light more than red light. Example: water boils at one hundred degrees. "
)
TAILS = ["Question: why is grass green?", "Question: what is a prime number?", "Hi"]


@pytest.fixture(scope="module")
def cases(tokenizer: Any, hf_model: Any) -> tuple[list[list[int]], list[list[int]]]:
    prompts = [tokenizer.encode(SHARED + t) for t in TAILS] + [tokenizer.encode("A short unrelated one.")]
    return prompts, [hf_greedy(hf_model, p, MAX) for p in prompts]


async def _body(engine: AsyncEngine, prompts: list[list[int]]) -> tuple[list[Any], dict[str, Any]]:
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX)
    await engine.complete(prompts[0][:40], SamplingParams(max_tokens=0))  # the shared part, cached first
    outs = await asyncio.gather(
        *(engine.complete(p, greedy) for p in prompts),
        engine.complete(prompts[1], SamplingParams(temperature=0.0, max_tokens=MAX, n=3)),
    )
    return list(outs), await engine.stats()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "lockstep"])
def test_cascade_decode_matches_transformers(overlap: bool, cases: Any) -> None:
    prompts, refs = cases
    cfg = engine_config(overlap=overlap, cascade_attention=True, cascade_min_shared=16, cascade_min_saved=16)
    outs, stats = run(with_engine, cfg, lambda e: _body(e, prompts))
    *singles, forks = outs
    for i, (out, ref) in enumerate(zip(singles, refs)):
        assert list(out.token_ids) == ref, f"prompt {i} differs"
    assert len(forks) == 3 and all(list(o.token_ids) == refs[1] for o in forks)
    assert stats["cascade_steps"] > 0 and stats["cascade_saved_slot_reads"] > 0


def test_cascade_attention_default_forms_no_groups_on_the_cpu(cases: Any) -> None:
    # None (auto) turns grouping on only where cascade steps replay CUDA graphs.
    prompts, refs = cases
    cfg = engine_config(cascade_min_shared=16, cascade_min_saved=16)
    assert cfg.cascade_attention is None
    outs, stats = run(with_engine, cfg, lambda e: _body(e, prompts))
    assert [list(o.token_ids) for o in outs[:-1]] == refs
    assert stats["cascade_steps"] == 0


def test_cascade_attention_false_turns_grouping_off() -> None:
    assert engine_config(cascade_attention=False).scheduler_config(vocab_size=1000).cascade_min_shared == 0
    with pytest.raises(ValueError, match="cascade_attention"):
        engine_config(cascade_attention="yes")
    assert (
        engine_config(cascade_attention=True, cascade_min_shared=300)
        .scheduler_config(vocab_size=1000)
        .cascade_min_shared
        == 300
    )
