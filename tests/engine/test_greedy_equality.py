"""Greedy output of the engine equals transformers' `generate`, token for token, in every mode."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, SamplingParams

from .conftest import engine_config, hf_greedy, run, with_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


async def _all(engine: AsyncEngine, prompts: list[list[int]]) -> list[Any]:
    return await asyncio.gather(*(engine.complete(p, GREEDY) for p in prompts))


def _check_first_round(outs: list[Any], prompts: list[list[int]], reference: list[list[int]]) -> None:
    for i, (out, ref) in enumerate(zip(outs, reference)):
        assert list(out.token_ids) == ref, f"prompt {i} differs"
        assert out.finish_reason in ("stop", "length")
        assert out.usage.prompt_tokens == len(prompts[i])
        assert out.usage.completion_tokens == len(ref)


def test_32_concurrent_requests_match_transformers_then_hit_the_radix_cache(prompts, reference) -> None:
    """The default engine (overlap on). The CPU pool is allocated with torch.empty: poisoned
    with NaN before any request, 32 requests of different lengths (padded decode) still equal
    transformers token for token. The same 32 again take all but each prompt's last token
    from the tree and give the same tokens."""

    async def body(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
        assert engine.pool is not None
        for buf in engine.pool.k + engine.pool.v:  # the worker is idle: no request yet
            buf.fill_(float("nan"))
        first = await _all(engine, prompts)
        second = await _all(engine, prompts)
        return first, second

    first, second = run(with_engine, engine_config(), body)
    _check_first_round(first, prompts, reference)
    for i, (b, ref) in enumerate(zip(second, reference)):
        assert list(b.token_ids) == ref, f"prompt {i} differs in round two"
        # The whole prompt but its last token is in the tree after round one.
        assert b.usage.cached_tokens == len(prompts[i]) - 1, (i, first[i].usage, b.usage)
    assert sum(o.usage.cached_tokens for o in second) > 0


def test_32_concurrent_requests_match_transformers_in_lockstep(prompts, reference) -> None:
    outs = run(with_engine, engine_config(overlap=False), lambda e: _all(e, prompts))
    _check_first_round(outs, prompts, reference)


def test_requests_sharing_a_prefix_wait_one_step_and_hit_the_cache(tokenizer, hf_model) -> None:
    system = tokenizer.encode(
        "You are a careful assistant. Answer briefly, cite no sources, and never invent facts. "
        "Examples: Q: two plus two? A: four. Q: the colour of grass? A: green."
    )
    prompts = [system + tokenizer.encode(f" Q: what is {i} plus {i}? A:") for i in range(8)]
    refs = [hf_greedy(hf_model, p, 8) for p in prompts]
    outs = run(
        with_engine,
        engine_config(),
        lambda e: asyncio.gather(
            *(e.complete(p, SamplingParams(temperature=0, max_tokens=8)) for p in prompts)
        ),
    )
    assert [list(o.token_ids) for o in outs] == refs
    # One request computes the shared prefix; the seven others, submitted in the same
    # step, wait a step and take it from the cache.
    hits = sorted(o.usage.cached_tokens for o in outs)
    assert hits[0] == 0
    assert all(h >= len(system) for h in hits[1:])


def test_chunked_prefill_of_16_tokens(prompts, reference) -> None:
    outs = run(with_engine, engine_config(chunked_prefill_size=16), lambda e: _all(e, prompts))
    assert [list(o.token_ids) for o in outs] == reference


ARRIVING = SamplingParams(temperature=0.0, max_tokens=16)
EARLY, LATE = [1, 3, 5], [2, 4, 24, 6]  # prompts of 51, 48, 43 tokens; then 94, 90, 37, 85


@pytest.fixture(scope="module")
def arrival_refs(reference) -> dict[int, list[int]]:
    """transformers' first 16 greedy tokens: the head of its 24 (greedy is a prefix-stable walk)."""
    return {i: reference[i][: ARRIVING.max_tokens] for i in EARLY + LATE}


@pytest.mark.parametrize(
    "overlap,mixed",
    [(True, True), (False, True), (True, False)],
    ids=["overlap", "lockstep", "prefill_first"],
)
def test_arrivals_while_others_decode(overlap: bool, mixed: bool, prompts, arrival_refs, hf_model) -> None:
    """Requests join while others stream, prefilled 16 tokens a step (beside the decodes when
    mixed) in a pool small enough to retract: the same tokens, prompt logprobs and n > 1."""

    async def body(engine: AsyncEngine) -> tuple[list[Any], Any, list[Any], dict[str, Any]]:
        first = [asyncio.ensure_future(engine.complete(prompts[i], ARRIVING)) for i in EARLY[1:]]
        joined: list[asyncio.Future[Any]] = []
        streamed: list[int] = []
        async for out in engine.generate(prompts[EARLY[0]], ARRIVING):
            streamed.extend(out.delta_token_ids)
            if not joined:  # its first token is out: the others join while it decodes
                lp = ARRIVING.replace(prompt_logprobs=True)
                joined.append(asyncio.ensure_future(engine.complete(prompts[LATE[0]], lp)))
                joined.append(asyncio.ensure_future(engine.complete(prompts[LATE[1]], ARRIVING.replace(n=2))))
                joined += [asyncio.ensure_future(engine.complete(prompts[i], ARRIVING)) for i in LATE[2:]]
        outs = [streamed, *[list(o.token_ids) for o in await asyncio.gather(*first)]]
        lp_out, pair, *rest = await asyncio.gather(*joined)
        return outs + [list(o.token_ids) for o in rest], lp_out, pair, await engine.stats()

    cfg = engine_config(
        overlap=overlap,
        mixed_steps=mixed,
        chunked_prefill_size=16,
        kv_cache_tokens=200,
        decode_reserve_ratio=0.0,
    )
    outs, lp_out, pair, stats = run(with_engine, cfg, body)
    assert outs == [arrival_refs[i] for i in EARLY + LATE[2:]]
    assert [list(o.token_ids) for o in pair] == [arrival_refs[LATE[1]]] * 2
    assert list(lp_out.token_ids) == arrival_refs[LATE[0]]
    ids = prompts[LATE[0]]
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert [t.token_id for t in lp_out.prompt_logprobs] == ids[1:]
    for p, tl in zip(range(1, len(ids)), lp_out.prompt_logprobs):
        assert abs(tl.logprob - lp[p - 1, ids[p]].item()) < 1e-3
    assert stats["retractions"] > 0


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "lockstep"])
def test_small_kv_pool_forces_retraction_with_unchanged_output(overlap: bool, prompts, reference) -> None:
    async def body(engine: AsyncEngine) -> tuple[list[Any], dict[str, Any]]:
        outs = await _all(engine, prompts)
        return outs, await engine.stats()

    # The longest prompt plus its output fits; all 32 at once do not.
    cfg = engine_config(kv_cache_tokens=400, overlap=overlap, decode_reserve_ratio=0.0)
    outs, stats = run(with_engine, cfg, body)
    assert stats["retractions"] > 0
    assert [list(o.token_ids) for o in outs] == reference


def test_radix_cache_off_gives_same_tokens_and_no_hits(prompts, reference) -> None:
    outs = run(with_engine, engine_config(enable_radix_cache=False), lambda e: _all(e, prompts))
    assert [list(o.token_ids) for o in outs] == reference
    assert all(o.usage.cached_tokens == 0 for o in outs)


def test_page_size_4(prompts, reference) -> None:
    outs = run(with_engine, engine_config(page_size=4), lambda e: _all(e, prompts))
    assert [list(o.token_ids) for o in outs] == reference
