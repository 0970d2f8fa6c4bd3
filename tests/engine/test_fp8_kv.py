"""The FP8 KV cache through the public API (`EngineConfig.kv_cache_dtype="fp8_e4m3"`), on the
CPU in float32: greedy tokens agree with transformers' with its attention's K and V
fake-quantized the same way (scale 1.0: the embedded checkpoint has no `k_scale` / `v_scale`), the pool holds
about twice the tokens of a bfloat16 cache in the same bytes, and the option is validated."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.cache.kv_quant import FP8_KV_DTYPE, fake_quantize

from .conftest import engine_config, run, with_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
ATTN_NAME = "radixserve_fp8_kv_reference"
NEAR_TIE = 0.25  # logits


@pytest.fixture(scope="module")
def fp8_hf_model(hf_model: Any) -> Iterator[Any]:
    """transformers' twin with K and V fake-quantized as an FP8 cache stores them, before SDPA.
    Keys already cached come back through it again: quantizing an e4m3 value at scale 1.0 is
    exact, so that changes nothing."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def fp8_kv_sdpa(
        module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any
    ) -> Any:
        return sdpa_attention_forward(module, q, fake_quantize(k, 1.0), fake_quantize(v, 1.0), *args, **kw)

    AttentionInterface.register(ATTN_NAME, fp8_kv_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)  # SDPA's masks, as "sdpa" builds
    before = hf_model.config._attn_implementation
    hf_model.set_attn_implementation(ATTN_NAME)
    try:
        yield hf_model
    finally:
        hf_model.set_attn_implementation(before)


def test_fp8_kv_greedy_tokens_agree_with_transformers_on_fake_quantized_kv(
    fp8_hf_model: Any, prompts: list[list[int]]
) -> None:
    """Teacher-forced: transformers' argmax over prompt + the engine's tokens, K/V fake-quantized,
    picks the engine's token at nearly every position, and where not, the engine's is within
    `NEAR_TIE` of its top logit. Not exact equality: an FP8 rounding is a step of 1/16, so a
    last-bit difference in how K is computed (one token at a time here, the whole sequence
    there) can flip one element's rounding and move a logit by a few hundredths."""
    chosen = prompts[::4]  # 8 prompts of mixed lengths, batched together

    async def body(engine: AsyncEngine) -> list[Any]:
        assert engine.pool is not None and engine.pool.k[0].dtype == FP8_KV_DTYPE
        first = await asyncio.gather(*(engine.complete(p, GREEDY) for p in chosen))
        again = await asyncio.gather(*(engine.complete(p, GREEDY) for p in chosen))  # from the tree
        return [*first, *again]

    outs = run(with_engine, engine_config(kv_cache_dtype="fp8_e4m3"), body)
    assert sum(o.usage.cached_tokens for o in outs[len(chosen) :]) > 0
    agree = total = 0
    for i, out in enumerate(outs):
        prompt, tokens = chosen[i % len(chosen)], list(out.token_ids)
        with torch.no_grad():
            logits = fp8_hf_model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        top = logits.max(-1).values
        mine = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
        assert bool(((top - mine) <= NEAR_TIE).all()), (i, (top - mine).max().item())
        agree += int((logits.argmax(-1) == torch.tensor(tokens)).sum())
        total += len(tokens)
    assert agree >= 0.95 * total, (agree, total)


def test_fp8_kv_cache_holds_twice_the_tokens_of_bf16_in_the_same_memory() -> None:
    async def total_slots(kv_cache_dtype: str) -> int:
        cfg = engine_config(dtype="bfloat16", kv_cache_bytes=64 << 20, kv_cache_dtype=kv_cache_dtype)
        async with AsyncEngine(cfg) as engine:
            stats = await engine.stats()
            assert (
                engine.pool is not None
                and engine.pool.nbytes <= (64 << 20) + engine.pool.config.bytes_per_slot
            )
            await engine.check_integrity()
            return int(stats["total_slots"])

    bf16 = asyncio.run(total_slots("auto"))
    fp8 = asyncio.run(total_slots("fp8_e4m3"))
    assert fp8 / bf16 >= 1.9, (fp8, bf16)


def test_kv_cache_dtype_is_validated() -> None:
    assert EngineConfig().kv_cache_dtype == "auto"
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"
    for bad in ("fp8", "fp8_e5m2", "float8_e4m3fn", None, 8):
        with pytest.raises(ValueError, match=r"EngineConfig\.kv_cache_dtype.*'auto' or 'fp8_e4m3'"):
            EngineConfig(kv_cache_dtype=bad)  # type: ignore[arg-type]
