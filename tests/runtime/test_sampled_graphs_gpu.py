"""Sampled decode steps replayed from CUDA graphs (runtime/sampled_graphs.py) draw exactly the
tokens of the eager sampler for the same per-row state, and an engine's sampled decode steps
do replay them (GPU only; the CPU side is test_sampled_graphs.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from radixserve.model.loader import load_model
from radixserve.runtime.runner import ModelRunner
from radixserve.runtime.sampler import Sampler, SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from graph_cases import graph_side  # noqa: E402
from test_fp8_gpu import tiny_llama  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MAX_BS, CONTEXT, SLOTS = 8, 512, 8192
SETS = {
    "plain": [
        SamplingParams(temperature=0.8, seed=i) if i % 2 else SamplingParams(temperature=1.2)
        for i in range(5)
    ],
    "masked": [
        SamplingParams(temperature=0.8, top_p=0.95, seed=1),
        SamplingParams(temperature=1.0, top_k=50),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, min_p=0.05, seed=2),
        SamplingParams(temperature=0.9, top_k=200, top_p=0.9, seed=3),
    ],
    "penalized": [
        SamplingParams(temperature=0.8, top_p=0.95, seed=4, frequency_penalty=0.5),
        SamplingParams(temperature=0, repetition_penalty=1.3),
        SamplingParams(temperature=1.0, presence_penalty=1.0, seed=5),
        SamplingParams(temperature=0.6),
        SamplingParams(temperature=1.1, min_p=0.02, seed=6),
    ],
}


@pytest.mark.parametrize("name", SETS)
def test_graph_replayed_sampling_equals_the_eager_sampler(name: str) -> None:
    pytest.importorskip("flashinfer")
    pytest.importorskip("triton")
    params = SETS[name]
    loaded = load_model("dummy:qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda")
    cfg, device = loaded.config, torch.device("cuda")
    _pool, table, attn = graph_side(cfg, MAX_BS, CONTEXT, SLOTS)
    runner = ModelRunner(loaded.model, attn, cfg.vocab_size, MAX_BS, device, table.device_table)
    assert runner.enable_cuda_graphs(MAX_BS, MAX_BS * CONTEXT, SLOTS)
    assert runner.sampled_graphs is not None
    twin = Sampler(cfg.vocab_size, MAX_BS, device)  # the eager path, on the same logits

    rng = np.random.default_rng(0)
    rows = np.array([6, 1, 3, 0, 4], dtype=np.int64)  # padded to the graph of 8
    prefix = rng.integers(20, 300, size=len(rows))
    ctx = rng.permutation(SLOTS)[: int(prefix.sum()) + 4 * len(rows)]
    off = 0
    for r, p in zip(rows, prefix):
        table.write(int(r), 0, torch.tensor(ctx[off : off + p], dtype=torch.int32))
        off += p
    torch.cuda.synchronize()
    n = len(rows)
    penalty_init = [(int(r), [5, 6]) for r, p in zip(rows, params) if p.uses_penalties]
    first = SamplingInputs.from_requests(rows.tolist(), params, [0] * n, [frozenset()] * n, penalty_init)
    for step in range(4):
        sampling = first if step == 0 else SamplingInputs(rows, params, first.flags)
        slots = ctx[off : off + n].astype(np.int64)
        off += n
        ids = np.full(n, -1, dtype=np.int64) if step else np.arange(n, dtype=np.int64) + 100
        inp = StepInput.decode(rows, prefix + step, slots, ids, sampling)
        replays, calls = runner.sampled_graphs.replays, runner.sampler.calls
        fwd = runner.forward(inp)
        assert fwd.graph_decode is inp and fwd.positions is not None
        with torch.cuda.stream(runner.stream):
            want = twin(fwd.logits.clone(), sampling, fwd.rows, fwd.positions.clone()).next_ids.cpu()
        got = runner.sample(fwd).result().next_ids
        assert got == want.tolist(), step
        assert runner.sampled_graphs.replays == replays + 1 and runner.sampler.calls == calls
        last = runner.last_tokens[torch.as_tensor(rows, device=device)].cpu()
        assert last.tolist() == want.clamp(min=0).tolist()
    if name == "penalized":
        assert runner.sampler.counts is not None and twin.counts is not None
        r = torch.as_tensor(rows, device=device)
        assert torch.equal(runner.sampler.counts[r], twin.counts[r])


def _sampled(folder: Path, prompts: list[list[int]], cuda_graph: bool) -> tuple[list[list[int]], int, int]:
    """Seeded sampled completions, and the sampled-graph replays and eager sampler calls."""
    from radixserve import AsyncEngine, EngineConfig

    params = [
        SamplingParams(
            temperature=0.8,
            top_p=0.95,
            seed=i,
            max_tokens=24,
            ignore_eos=True,
            presence_penalty=0.3 * (i % 2),
        )
        for i in range(len(prompts))
    ]
    config = EngineConfig(model=str(folder), device="cuda", dtype="bfloat16", cuda_graph=cuda_graph)

    async def main() -> tuple[list[list[int]], int, int]:
        async with AsyncEngine(config) as engine:
            outs = await asyncio.gather(*(engine.complete(p, sp) for p, sp in zip(prompts, params)))
            runner = engine._worker.runner  # type: ignore[union-attr]
            replays = runner.sampled_graphs.replays if runner.sampled_graphs is not None else 0
            return [list(o.token_ids) for o in outs], replays, runner.sampler.calls  # type: ignore[union-attr]

    return asyncio.run(main())


def test_engine_sampled_decode_replays_graphs_and_keeps_its_tokens(tmp_path: Path) -> None:
    """Through the public API: seeded sampled requests give the same tokens with and without
    CUDA graphs, and with graphs their decode steps are drawn by sampled graphs, not eagerly."""
    pytest.importorskip("triton")
    tiny_llama(tmp_path)
    prompts = [
        torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (5, 12, 23, 40)
    ]
    graphed, replays, calls = _sampled(tmp_path, prompts, cuda_graph=True)
    eager, no_replays, eager_calls = _sampled(tmp_path, prompts, cuda_graph=False)
    assert graphed == eager
    assert all(len(t) == 24 for t in graphed)
    assert no_replays == 0 and eager_calls >= 23  # every decode step sampled eagerly
    assert replays >= 20 and calls <= eager_calls - 20  # prefill steps stay eager
