"""Seeded sampling through AsyncEngine: a seeded request's tokens depend on its prompt, seed and
parameters alone (runtime/noise.py), whichever row it takes, whatever else runs beside it,
and whether its prompt came from the cache."""

from __future__ import annotations

import asyncio

from radixserve import AsyncEngine, SamplingParams

from .conftest import engine_config, run, with_engine

PROMPTS = ["My favourite animal is", "The ocean at night", "Three things to pack:"]
SEEDED = [
    SamplingParams(temperature=0.8, top_p=0.95, seed=1234, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=1.1, top_k=20, min_p=0.02, seed=7, max_tokens=12, ignore_eos=True),
    SamplingParams(
        temperature=0.9,
        seed=99,
        frequency_penalty=0.6,
        presence_penalty=0.4,
        repetition_penalty=1.2,
        max_tokens=12,
        ignore_eos=True,
    ),
]
NOISE = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)  # unseeded neighbours


async def _tokens(
    engine: AsyncEngine, prompts: list[str], params: list[SamplingParams]
) -> list[tuple[int, ...]]:
    outs = await asyncio.gather(*(engine.complete(p, sp) for p, sp in zip(prompts, params)))
    return [tuple(o.token_ids) for o in outs]  # type: ignore[union-attr]


def test_seeded_requests_repeat_alone_in_batches_and_from_the_cache() -> None:
    async def body(engine: AsyncEngine) -> None:
        alone = [(await _tokens(engine, [p], [sp]))[0] for p, sp in zip(PROMPTS, SEEDED)]
        await engine.flush_cache()
        # Neighbours first, so the seeded requests take other rows and share their steps.
        mixed = await _tokens(engine, ["Once upon a time"] * 3 + PROMPTS, [NOISE] * 3 + SEEDED)
        assert mixed[3:] == alone
        cached = await _tokens(engine, list(reversed(PROMPTS)), list(reversed(SEEDED)))  # prompts cached
        assert list(reversed(cached)) == alone
        other = await _tokens(engine, PROMPTS[:1], [SEEDED[0].replace(seed=4321)])
        assert other[0] != alone[0]
        assert all(len(t) == 12 for t in alone)

    run(with_engine, engine_config(), body)
