"""GPU memory beside the KV pool: the sampler's workspace is measured and left out of the pool's
fraction (runtime/workspace.py), and every decode graph shares one logits buffer
(runtime/cuda_graph.py), so a large vocabulary at a full batch starts and samples under
CUDA graphs even with a pool fraction that leaves little else. GPU only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from radixserve.runtime.workspace import sampling_workspace_bytes
from radixserve.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VOCAB, ROWS = 262_144, 256  # Gemma 3's vocabulary at the engine's default batch


def _large_vocab_llama(folder: Path) -> None:
    """A random tiny Llama with Gemma 3's vocabulary size, saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)


def test_sampling_workspace_is_measured_and_chunked() -> None:
    """The measured workspace grows with the rows, but less than in proportion past one chunk
    (64 rows of a 262k vocabulary: their temporaries are a chunk's, the logits and penalty
    state the batch's), and nothing of it stays allocated."""
    device = torch.device("cuda")
    before = torch.cuda.memory_allocated(device)
    small, large = (sampling_workspace_bytes(r, VOCAB, device) for r in (32, ROWS))
    assert torch.cuda.memory_allocated(device) == before
    assert 20 < small / (32 * VOCAB) < 120  # bytes per entry in one chunk
    assert 2 < large / small < 5, (small, large)  # 8 without the chunks


def test_large_vocabulary_full_batch_starts_and_samples_under_graphs(tmp_path: Path) -> None:
    """mem_fraction 0.97 leaves ~2 GiB beside the pool on an 80 GiB card: before the workspace
    was measured, capturing the sampled graphs of 256 rows x 262k logits ran out of memory
    at start. Now the engine starts, and sampled requests with top-p and penalties replay them."""
    pytest.importorskip("triton")
    from radixserve import AsyncEngine, EngineConfig

    _large_vocab_llama(tmp_path)
    config = EngineConfig(
        model=str(tmp_path),
        device="cuda",
        dtype="bfloat16",
        max_running_requests=ROWS,
        mem_fraction=0.97,
        context_length=1024,
    )
    params = [
        SamplingParams(
            temperature=0.8, top_p=0.9, seed=i, max_tokens=16, ignore_eos=True, presence_penalty=0.5
        )
        for i in range(8)
    ]
    prompts = [[(1000 * i + 7 * j) % VOCAB for j in range(5 + i)] for i in range(8)]

    async def main() -> tuple[list[list[int]], int]:
        async with AsyncEngine(config) as engine:
            outs = await asyncio.gather(*(engine.complete(p, sp) for p, sp in zip(prompts, params)))
            runner = engine._worker.runner  # type: ignore[union-attr]
            assert runner.sampled_graphs is not None
            return [list(o.token_ids) for o in outs], runner.sampled_graphs.replays

    tokens, replays = asyncio.run(main())
    assert all(len(t) == 16 and all(0 <= x < VOCAB for x in t) for t in tokens)
    assert replays >= 10
