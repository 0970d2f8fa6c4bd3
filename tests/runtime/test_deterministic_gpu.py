"""`EngineConfig(deterministic=True)` on CUDA with the Triton backend (FlashInfer is refused
there). GPU only; the CPU side is tests/runtime/test_deterministic.py and
tests/engine/test_deterministic.py. The Triton linear's rows and the invariant Triton
attention's tokens keep their bits whatever the batch, and 64 prompts give the same tokens
alone as inside batches of 8, 64 and 256 with other requests and small chunks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# Dummy weights of SmolLM2's shape: the GPU machine has no embedded model, and near-uniform
# logits make any reordered sum show (a seeded draw or a near-tie flips).
MODEL = {"model": "dummy:smollm2-135m", "device": "cuda"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_linear_rows_do_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    from radixserve.runtime.triton_matmul import triton_linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(4096, 2048, device="cuda", generator=gen) * 0.02).to(dtype)
    x = torch.randn(1024, 2048, device="cuda", generator=gen).to(dtype)
    alone = triton_linear(x[:1], w)
    for m in (1, 3, 17, 64, 255, 1024):
        y = triton_linear(x[:m], w)
        assert torch.equal(y[:1], alone), m
        ref = torch.nn.functional.linear(x[:m].float(), w.float())
        assert float((y.float() - ref).norm() / ref.norm()) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_invariant_triton_attention_on_cuda() -> None:
    from deterministic_cases import HKV, HQ, D, invariance_case, option_cases

    from radixserve.runtime.attention.triton_invariant import InvariantTritonAttention

    for opts in option_cases().values():
        res = invariance_case(
            lambda pool, o: InvariantTritonAttention(pool, HQ, HKV, D, D**-0.5, o), opts, device="cuda"
        )
        assert res["chunked_vs_whole"] == 0.0 and res["decoded_vs_whole"] == 0.0, res
        assert res["graph_decoded_vs_whole"] == 0.0, res


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 30000, (int(torch.randint(8, 300, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


# Batch size -> chunking: small chunks split prompts across steps; larger ones for 256.
BATCHES = {
    8: dict(chunked_prefill_size=64, mixed_prefill_tokens=32),
    64: dict(chunked_prefill_size=64, mixed_prefill_tokens=32),
    256: dict(chunked_prefill_size=256, mixed_prefill_tokens=128, max_running_requests=256),
}


@pytest.mark.parametrize("backend", ["triton"])
def test_64_prompts_same_tokens_alone_and_in_batches(backend: str) -> None:
    """64 prompts (odd ones seeded, even ones greedy) alone, then inside batches of 8, 64 and
    256: half of each batch targets, half other requests, arrivals staggered, half of each
    target prompt cached first (a radix hit mid-prompt)."""
    targets, others = _prompts(64, 1), _prompts(192, 2)

    def params(i: int) -> SamplingParams:
        if i % 2:
            return SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=32, ignore_eos=True)
        return SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    async def alone() -> list[list[int]]:
        cfg = EngineConfig(**MODEL, deterministic=True, attention_backend=backend, enable_radix_cache=False)
        async with AsyncEngine(cfg) as e:
            return [list((await e.complete(p, params(i))).token_ids) for i, p in enumerate(targets)]

    async def batched(size: int) -> list[list[int]]:
        cfg = EngineConfig(**MODEL, deterministic=True, attention_backend=backend, **BATCHES[size])
        async with AsyncEngine(cfg) as e:
            await asyncio.gather(
                *(e.complete(p[: len(p) // 2], SamplingParams(max_tokens=1)) for p in targets)
            )

            async def one(k: int, p: list[int], sp: SamplingParams) -> list[int]:
                await asyncio.sleep(0.005 * (k % 7))
                return list((await e.complete(p, sp)).token_ids)

            out: list[list[int]] = []
            half = size // 2
            for g in range(0, len(targets), half):
                jobs = [one(i, p, params(i)) for i, p in enumerate(targets[g : g + half], g)]
                n = len(jobs)
                jobs += [
                    one(
                        j,
                        others[(g + j) % len(others)],
                        SamplingParams(temperature=0.7, max_tokens=5 + j % 40),
                    )
                    for j in range(size - n)
                ]
                out += list(await asyncio.gather(*jobs))[:n]
            return out

    ref = asyncio.run(alone())
    for size in BATCHES:
        got = asyncio.run(batched(size))
        assert [i for i, (a, b) in enumerate(zip(ref, got)) if a != b] == [], f"batch of {size}"
