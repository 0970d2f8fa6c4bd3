"""`EngineConfig(deterministic=True)` through the public API: prompts, greedy and seeded,
give the same tokens alone as inside batches of 8 and 64 with other traffic (other
prompts, staggered arrivals, radix-cache hits on part of the prompt, chunked prefill with a
small chunk), so with every way the scheduler may split and batch them.

CI runs 6 prompts (each greedy and seeded) of 6 tokens; `RADIXSERVE_DETERMINISTIC_PROMPTS=16`
(at most 16: the session's prompt set) runs more, as the GPU test does with 64."""

from __future__ import annotations

import asyncio
import os

import pytest

from radixserve import AsyncEngine, SamplingParams

from .conftest import engine_config, run, with_engine

TOKENS = 6
TARGETS = min(16, int(os.environ.get("RADIXSERVE_DETERMINISTIC_PROMPTS", "6"))) // 2 * 2  # batches take pairs


def _params(i: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, seed=1000 + i, max_tokens=TOKENS, ignore_eos=True),
    ]


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


async def _in_batches_of_8(
    engine: AsyncEngine, targets: list[list[int]], others: list[list[int]]
) -> list[list[int]]:
    # Half of each prompt goes into the tree first: the batched run hits it mid-prompt.
    await asyncio.gather(*(engine.complete(p[: len(p) // 2], _other(0)) for p in targets))
    out: list[list[int]] = []
    for g in range(0, len(targets), 2):  # 2 targets x 2 params + 4 others per batch
        jobs = [(targets[i], sp) for i in (g, g + 1) for sp in _params(i)]
        jobs += [(others[(g + j) % len(others)], _other(g + j)) for j in range(4)]
        out += (await _staggered(engine, jobs))[:4]
    return out


async def _in_one_batch_of_64(
    engine: AsyncEngine, targets: list[list[int]], others: list[list[int]]
) -> list[list[int]]:
    jobs = [(p, sp) for i, p in enumerate(targets) for sp in _params(i)]
    jobs += [(others[j % len(others)][j // len(others) :], _other(j)) for j in range(64 - len(jobs))]
    return (await _staggered(engine, jobs))[: 2 * len(targets)]


@pytest.mark.slow
def test_deterministic_tokens_do_not_depend_on_the_batch(prompts: list[list[int]]) -> None:
    targets, others = prompts[::2][:TARGETS], prompts[1::2]  # mixed lengths, chat and raw
    alone = run(
        with_engine, engine_config(deterministic=True, enable_radix_cache=False), lambda e: _alone(e, targets)
    )
    small_chunks = dict(
        deterministic=True, chunked_prefill_size=16, mixed_prefill_tokens=8, max_running_requests=64
    )
    by8 = run(with_engine, engine_config(**small_chunks), lambda e: _in_batches_of_8(e, targets, others))
    by64 = run(with_engine, engine_config(**small_chunks), lambda e: _in_one_batch_of_64(e, targets, others))
    for k, ref in enumerate(alone):
        assert len(ref) == TOKENS
        assert by8[k] == ref, (k, "batch of 8", by8[k], ref)
        assert by64[k] == ref, (k, "batch of 64", by64[k], ref)


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
