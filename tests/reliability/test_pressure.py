"""Memory pressure and long prompts (issue 8, items 6 and 10)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.config import CPU_CHUNK, GPU_CHUNK
from radixserve.testing import inject_faults

from .conftest import engine_config, hf_greedy

pytestmark = pytest.mark.timeout(300)
T = 120


def _prompt(tokenizer: Any, n: int, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text * (n // 2 + 1))[:n]
    assert len(ids) == n
    return ids


def test_a_request_that_fits_is_not_aborted_when_the_pool_runs_dry(tokenizer: Any, hf_model: Any) -> None:
    big = _prompt(tokenizer, 67, " hello world")
    small = _prompt(tokenizer, 18, " the cat sat on the mat")
    alone = _prompt(tokenizer, 70, " one two three")
    small_ref = hf_greedy(hf_model, small, 4)
    alone_ref = hf_greedy(hf_model, alone, 12)  # at most 10 fit the pool

    async def main() -> None:
        async with AsyncEngine(engine_config(kv_cache_tokens=80)) as eng:
            g = SamplingParams(temperature=0, ignore_eos=True)
            b, s = await asyncio.wait_for(
                asyncio.gather(
                    eng.complete(big, g.replace(max_tokens=32)), eng.complete(small, g.replace(max_tokens=4))
                ),
                T,
            )
            assert s.finish_reason == "length" and list(s.token_ids) == small_ref, s
            # 67 + 32 tokens cannot fit 80 slots: the big one ends when the pool is full, tokens so far kept
            assert b.finish_reason == "abort" and "too small" in (b.error or "")
            assert list(b.token_ids) == hf_greedy(hf_model, big, len(b.token_ids)) and len(b.token_ids) >= 10
            # alone, a request whose prompt fits runs until the pool is full (no reserve refusing it)
            a = await asyncio.wait_for(eng.complete(alone, g.replace(max_tokens=64)), T)
            assert len(a.token_ids) >= 9 and list(a.token_ids) == alone_ref[: len(a.token_ids)], a
            await eng.check_integrity()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("decode_reserve_ratio", float("nan")),  # failed the worker at the first admission
        ("decode_reserve_ratio", "0.5"),  # likewise (a TypeError in the scheduler)
        ("decode_reserve_ratio", -0.1),
        ("decode_reserve_ratio", 1.5),
        ("decode_reserve_ratio", True),
        ("kv_cache_tokens", 0),
        ("kv_cache_bytes", -1),  # was one slot
        ("context_length", 0),  # was the model's whole context
        ("context_length", 8.5),
        ("mem_fraction", "a"),  # was a TypeError from the comparison
    ],
)
def test_engine_config_refuses_numbers_the_engine_cannot_use(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=f"EngineConfig.{field}="):
        EngineConfig(**{field: bad})  # type: ignore[arg-type]


def test_a_full_reserve_never_sends_a_request_back(tokenizer: Any, hf_model: Any) -> None:
    """`decode_reserve_ratio=1.0` admits a request only when every running one's remaining tokens
    fit: requests that all run to `max_tokens` then never go back to the queue, where 0 (admit
    whatever fits now) sends some back in the same pool; the tokens are the same either way."""
    prompts = [_prompt(tokenizer, 12 + i, " the cat sat on the mat") for i in range(6)]
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    refs = [hf_greedy(hf_model, ids, 24) for ids in prompts]

    async def main(ratio: float) -> int:
        # 6 x (~15 + 24) tokens need ~230 slots; 120 hold about three requests at full length.
        async with AsyncEngine(engine_config(kv_cache_tokens=120, decode_reserve_ratio=ratio)) as eng:
            outs = await asyncio.wait_for(asyncio.gather(*(eng.complete(ids, p) for ids in prompts)), T)
            assert [list(o.token_ids) for o in outs] == refs
            await eng.check_integrity()
            return int((await eng.stats())["retractions"])

    assert asyncio.run(main(0.0)) > 0
    assert asyncio.run(main(1.0)) == 0


def test_prefill_chunk_is_chosen_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineConfig(device="cpu").prefill_chunk == CPU_CHUNK == 512
    assert EngineConfig(device="cpu").scheduler_config(vocab_size=1000).chunked_prefill_size == CPU_CHUNK
    assert (
        EngineConfig(device="cpu", chunked_prefill_size=64)
        .scheduler_config(vocab_size=1000)
        .chunked_prefill_size
        == 64
    )
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        EngineConfig(chunked_prefill_size=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert EngineConfig(device="cuda").prefill_chunk == GPU_CHUNK == 8192


def test_long_prefill_yields_to_decodes_and_cancels_between_chunks(tokenizer: Any) -> None:
    chunk = 16
    long_ids = _prompt(tokenizer, 16 * chunk, " a long and winding road")
    steps: list[int] = []

    def count(step: int, logits: torch.Tensor, sampling: Any) -> torch.Tensor:
        steps.append(step)
        return logits

    async def main() -> None:
        async with AsyncEngine(engine_config(chunked_prefill_size=chunk)) as eng:
            inject_faults(eng, count)
            events: list[str] = []

            async def short() -> None:
                p = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
                async for out in eng.generate("Count to ten:", p):
                    # per token: a reader that falls behind gets several in one output
                    events.extend(["short"] * len(out.delta_token_ids))

            async def long() -> None:
                await eng.complete(long_ids, SamplingParams(max_tokens=1))
                events.append("long")

            s = asyncio.create_task(short())
            while not events:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(asyncio.gather(s, long()), T)
            # the short stream went on while the 16 chunks ran (prefill-first alone would starve it)
            assert events.count("short") == 30
            assert events.index("long") > 12, events

            # cancel during a long prefill: it ends within a step or two, not after all 16 chunks
            long_ids2 = _prompt(tokenizer, 16 * chunk, " another long and winding road")
            start = len(steps)
            task = asyncio.create_task(eng.complete(long_ids2, SamplingParams(max_tokens=1)))
            while len(steps) < start + 2:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(500):
                st = await eng.stats()
                if not st["running"] and not st["waiting"]:
                    break
                await asyncio.sleep(0.01)
            assert len(steps) - start < 8, len(steps) - start
            await eng.check_integrity()

    asyncio.run(main())
