"""`EngineConfig(deterministic=True)` through the public API: prompts, greedy and seeded,
give the same tokens alone as inside batches of 8, 64 and 256 with other traffic (other
prompts, staggered arrivals, radix-cache hits on part of the prompt, chunked prefill with a
small chunk), so with every way the scheduler may split and batch them.

CI runs 6 prompts (each greedy and seeded) of 6 tokens; `RADIXSERVE_DETERMINISTIC_PROMPTS=64`
runs 64 (the session's 16 prompts, then seeded random ids), as the GPU test does."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from radixserve import AsyncEngine, SamplingParams

from .conftest import engine_config, run, with_engine

TOKENS = 6
TARGETS = min(64, int(os.environ.get("RADIXSERVE_DETERMINISTIC_PROMPTS", "6"))) // 2 * 2  # batches take pairs
# Batch size -> the engine settings it runs under: small chunks split every prompt across steps;
# the batch of 256 takes larger ones so that CI's run stays short.
BATCHES = {
    8: dict(chunked_prefill_size=16, mixed_prefill_tokens=8, max_running_requests=64),
    64: dict(chunked_prefill_size=16, mixed_prefill_tokens=8, max_running_requests=64),
    256: dict(chunked_prefill_size=64, mixed_prefill_tokens=32, max_running_requests=256),
}


def _params(i: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, seed=1000 + i, max_tokens=TOKENS, ignore_eos=True),
    ]


def _targets(prompts: list[list[int]]) -> list[list[int]]:
    """`TARGETS` prompts: every other of the session's (mixed lengths, chat and raw), then
    seeded random ids of 8-120 tokens."""
    chosen, rng = list(prompts[::2]), random.Random(7)
    while len(chosen) < TARGETS:
        chosen.append([rng.randrange(10, 40000) for _ in range(rng.randint(8, 120))])
    return chosen[:TARGETS]


async def _alone(engine: AsyncEngine, targets: list[list[int]]) -> list[list[int]]:
    out = []
    for i, p in enumerate(targets):
        for sp in _params(i):
            out.append(list((await engine.complete(p, sp)).token_ids))
    return out


async def _staggered(engine: AsyncEngine, jobs: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    async def one(k: int, p: list[int], sp: SamplingParams) -> list[int]:
        await asyncio.sleep(0.02 * (k % 5))  # arrivals spread over the first steps
        return list((await engine.complete(p, sp)).token_ids)

    return list(await asyncio.gather(*(one(k, p, sp) for k, (p, sp) in enumerate(jobs))))


def _other(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.7, max_tokens=4 + i % 9, ignore_eos=True)


async def _in_batches(
    engine: AsyncEngine, targets: list[list[int]], others: list[list[int]], size: int
) -> list[list[int]]:
    """The targets (each greedy and seeded) a quarter of a batch at a time, the rest of each
    batch of `size` other requests (other prompts, or parts of them), all staggered."""
    # Half of each prompt goes into the tree first: the batched run hits it mid-prompt.
    await asyncio.gather(*(engine.complete(p[: len(p) // 2], _other(0)) for p in targets))
    out: list[list[int]] = []
    group = max(2, size // 4)
    for g in range(0, len(targets), group):
        jobs = [(p, sp) for i, p in enumerate(targets[g : g + group], g) for sp in _params(i)]
        n = len(jobs)
        for j in range(size - n):
            p = others[(g + j) % len(others)]
            jobs.append((p[min(j // len(others), len(p) - 1) :], _other(g + j)))
        out += (await _staggered(engine, jobs))[:n]
    return out


@pytest.mark.slow
def test_deterministic_tokens_do_not_depend_on_the_batch(prompts: list[list[int]]) -> None:
    targets, others = _targets(prompts), prompts[1::2]
    alone = run(
        with_engine, engine_config(deterministic=True, enable_radix_cache=False), lambda e: _alone(e, targets)
    )
    for size, settings in BATCHES.items():
        got = run(
            with_engine,
            engine_config(deterministic=True, **settings),
            lambda e, size=size: _in_batches(e, targets, others, size),
        )
        for k, ref in enumerate(alone):
            assert len(ref) == TOKENS
            assert got[k] == ref, (k, f"batch of {size}", got[k], ref)


def test_deterministic_refuses_what_it_cannot_keep_invariant() -> None:
    for bad in (
        dict(quantization="fp8"),
        dict(kv_cache_dtype="fp8_e4m3"),
        dict(attention_backend="flashinfer"),
        dict(cascade_attention=True),
    ):
        with pytest.raises(ValueError, match="deterministic"):
            engine_config(deterministic=True, **bad)
    assert engine_config(deterministic=True).scheduler_config(vocab_size=1000).cascade_min_shared == 0
