"""Prompt logprobs are exact across prefill chunks: every position's logprob equals
transformers' log-softmax of the prompt, and the count is exact, for prompts of one, two and
three chunks, alone and concurrent, prompt-only (`max_tokens=0`) or generating, in overlap,
lockstep and prefill-first mode, and after a radix-cache hit (a cached prefix never skips a
requested position).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, SamplingParams

from .conftest import _WORDS, engine_config, run, with_engine

CHUNK = 32  # small chunks keep the prompts (and the test) short
LENGTHS = (20, 50, 90)  # one, two and three chunks
TOL = 1e-4
ONLY = SamplingParams(max_tokens=0, prompt_logprobs=True)


@pytest.fixture(scope="module")
def chunk_prompts(tokenizer: Any) -> list[list[int]]:
    """Three prompts of distinct text (no shared prefix) of `LENGTHS` tokens."""
    out = []
    for k, n in enumerate(LENGTHS):
        words = _WORDS[k * 7 :] + _WORDS
        ids = tokenizer.encode(" ".join(words))
        assert len(ids) >= n
        out.append(ids[:n])
    assert len({tuple(p[:2]) for p in out}) == len(out)
    return out


@pytest.fixture(scope="module")
def hf_lps(hf_model: Any, chunk_prompts: list[list[int]]) -> list[list[float]]:
    """transformers' logprob of each prompt token given the ones before it (position 1 on)."""
    refs = []
    with torch.no_grad():
        for ids in chunk_prompts:
            lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
            refs.append([lp[p - 1, ids[p]].item() for p in range(1, len(ids))])
    return refs


def _check(out: Any, ids: list[int], ref: list[float], start: int = 0) -> None:
    first = max(start, 1)
    got = out.prompt_logprobs
    assert len(got) == len(ids) - first, (len(ids), start, len(got))
    assert [t.token_id for t in got] == ids[first:]
    worst = max(abs(t.logprob - r) for t, r in zip(got, ref[first - 1 :]))
    assert worst < TOL, worst


@pytest.mark.parametrize(
    "overlap,mixed",
    [(True, True), (False, True), (True, False)],
    ids=["overlap", "lockstep", "prefill_first"],
)
def test_one_two_and_three_chunks_alone_then_concurrent(
    overlap: bool, mixed: bool, chunk_prompts: list[list[int]], hf_lps: list[list[float]]
) -> None:
    async def body(engine: AsyncEngine) -> tuple[list[Any], list[Any], list[Any]]:
        alone = [await engine.complete(p, ONLY) for p in chunk_prompts]
        # Concurrent: the chunk budget is shared, so the parts of a prompt fall in
        # different steps beside other prompts' parts; twice each, prompt-only and generating.
        gen = ONLY.replace(max_tokens=3, temperature=0.0, ignore_eos=True)
        both = await asyncio.gather(
            *(engine.complete(p, ONLY) for p in chunk_prompts),
            *(engine.complete(p, gen) for p in chunk_prompts),
        )
        return alone, list(both[:3]), list(both[3:])

    alone, only, generating = run(
        with_engine, engine_config(overlap=overlap, mixed_steps=mixed, chunked_prefill_size=CHUNK), body
    )
    for outs in (alone, only, generating):
        for out, ids, ref in zip(outs, chunk_prompts, hf_lps):
            _check(out, ids, ref)
    assert all(o.token_ids == () and o.finish_reason == "length" for o in alone + only)
    assert all(len(o.token_ids) == 3 for o in generating)


def test_a_cache_hit_still_scores_every_requested_position(
    chunk_prompts: list[list[int]], hf_lps: list[list[float]]
) -> None:
    """The prompts are in the tree; a request for logprobs from position p takes at most
    p - 1 tokens from it, exactly (the logits of position p - 1 score token p), and one from 0 none."""

    async def body(engine: AsyncEngine) -> list[tuple[int, int, Any]]:
        await asyncio.gather(*(engine.complete(p, SamplingParams(max_tokens=0)) for p in chunk_prompts))
        cases = [
            (i, s)
            for i, ids in enumerate(chunk_prompts)
            for s in (0, 1, 7, CHUNK + 3, len(ids) - 1)
            if s < len(ids)
        ]
        outs = await asyncio.gather(
            *(engine.complete(chunk_prompts[i], ONLY.replace(prompt_logprobs_start=s)) for i, s in cases)
        )
        return [(i, s, o) for (i, s), o in zip(cases, outs)]

    results = run(with_engine, engine_config(chunked_prefill_size=CHUNK), body)
    for i, start, out in results:
        ids = chunk_prompts[i]
        _check(out, ids, hf_lps[i], start)
        # The whole prompt is cached; exactly what precedes the first scored logit comes from it.
        assert out.usage.cached_tokens == max(start - 1, 0), (len(ids), start, out.usage)


def test_few_scored_rows_cut_the_chunks_and_keep_every_logprob(
    chunk_prompts: list[list[int]], hf_lps: list[list[float]]
) -> None:
    """With `prompt_logprob_rows=4` a step scores at most 4 prompt positions (the logits rows
    it may add for them), so the prompts go in chunks of ~4 tokens from their first scored
    position: every logprob still equals transformers', concurrent or not, and a prompt
    without prompt logprobs shares the steps."""

    async def body(engine: AsyncEngine) -> tuple[list[Any], Any]:
        starts = [0, 30, 60]
        outs = await asyncio.gather(
            *(
                engine.complete(p, ONLY.replace(prompt_logprobs_start=s))
                for p, s in zip(chunk_prompts, starts)
            ),
            engine.complete(chunk_prompts[2][::-1], SamplingParams(max_tokens=2)),
        )
        return list(outs[:3]), outs[3]

    outs, plain = run(with_engine, engine_config(prompt_logprob_rows=4, chunked_prefill_size=CHUNK), body)
    for out, ids, ref, start in zip(outs, chunk_prompts, hf_lps, [0, 30, 60]):
        _check(out, ids, ref, start)
    assert len(plain.token_ids) == 2 and not plain.prompt_logprobs


def test_the_scored_rows_per_step_follow_the_vocabulary_unless_given() -> None:
    """By default 2^27 logits' worth of rows (at least the batch rows); or as configured."""
    from radixserve import EngineConfig

    rows = [
        EngineConfig(device="cpu").scheduler_config(vocab_size=v).prompt_logprob_rows
        for v in (131072, 262144)
    ]
    assert rows == [1024, 512]
    assert (
        EngineConfig(device="cpu", max_running_requests=2048).scheduler_config(262144).prompt_logprob_rows
        == 2048
    )
    assert EngineConfig(device="cpu", prompt_logprob_rows=7).scheduler_config(262144).prompt_logprob_rows == 7
    with pytest.raises(ValueError, match="prompt_logprob_rows"):
        EngineConfig(device="cpu", prompt_logprob_rows=0)
