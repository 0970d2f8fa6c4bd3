"""Gemma 2/3, Phi-3, Mixtral, Qwen3-MoE and Qwen2-MoE through the public engine API: a batch
of concurrent requests with prefixes longer than the sliding window, prefilled in chunks shorter
than the prompts, equals transformers' greedy `generate`; the same requests again take all but
each prompt's last token from the radix cache and give the same tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams

NEW_KINDS = ("gemma2", "gemma3", "phi3-longrope", "mixtral", "qwen3-moe", "qwen2-moe")
NEW_TOKENS = 12
SHARED = 14  # a shared prefix past the windows (8; Phi-3's 12)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(3, 256, (SHARED,), generator=g).tolist()
    tails = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (1, 4, 9)]
    alone = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 21)]
    return [shared + t for t in tails] + alone


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_batched_chunked_and_cached_requests_match_transformers(
    tmp_path: Path, helpers: Any, kind: str
) -> None:
    hf = helpers.make_tiny_checkpoint(kind, tmp_path)
    prompts = _prompts()
    refs = [helpers.hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    config = EngineConfig(
        model=str(tmp_path),
        device="cpu",
        chunked_prefill_size=8,
        # Shared-prefix decode where the backend computes it: not beside windows or soft-caps.
        cascade_attention=True,
        cascade_min_shared=8,
        cascade_min_saved=8,
    )

    async def main() -> tuple[list[Any], list[Any], dict[str, Any]]:
        async with AsyncEngine(config) as engine:
            first = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
            second = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
            await engine.check_integrity()
            return first, second, await engine.stats()

    first, second, stats = asyncio.run(main())
    assert [list(o.token_ids) for o in first] == refs
    assert [list(o.token_ids) for o in second] == refs
    assert [o.usage.cached_tokens for o in second] == [len(p) - 1 for p in prompts]
    assert (stats["cascade_steps"] > 0) == (kind == "qwen3-moe")  # the one without windows
