"""Sampling of graph-replayed decode steps (radixserve/runtime/sampled_graphs.py) on the CPU.

What its graphs run, `commit_sampled`, against the eager sampler on the same logits: the
same tokens for the same per-row state (seeded and unseeded rows, every mask, penalties and
their counts), written to the step's real rows only. The captured graphs themselves run on
the GPU in test_sampled_graphs_gpu.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from radixserve.runtime.sampled_graphs import SampledGraphs, commit_sampled
from radixserve.runtime.sampler import INVALID_TOKEN, PENALTIES, TOP_K_P, Sampler, SamplingInputs
from radixserve.sampling_params import SamplingParams

CAP, BS, V = 8, 6, 50
ROWS = [5, 0, 2, 7]  # the step's real rows; graph rows 4 and 5 are padding
CPU = torch.device("cpu")

PLAIN = [
    SamplingParams(temperature=0.8, seed=11),
    SamplingParams(temperature=1.3),  # unseeded: a random key drawn when it takes its row
    SamplingParams(temperature=0),  # greedy, in a sampled step
    SamplingParams(temperature=0.6, seed=-4),
]
MASKED = [
    SamplingParams(temperature=0.9, top_p=0.8, seed=3),
    SamplingParams(temperature=1.0, top_k=4),
    SamplingParams(temperature=1.1, min_p=0.2, seed=5),
    SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, seed=6),
]
PENALIZED = [
    SamplingParams(temperature=0.9, seed=1, repetition_penalty=1.4),
    SamplingParams(temperature=0, frequency_penalty=0.9),
    SamplingParams(temperature=1.0, seed=2, presence_penalty=1.5),
    SamplingParams(temperature=0.8),
]
BOTH = [MASKED[0], PENALIZED[0], MASKED[2], PENALIZED[1]]


def _staging(rows: list[int]) -> SimpleNamespace:
    """The step-fill staging layout [n, ids[cap], rows[cap], ...]; padding rows hold stale rows."""
    buf = torch.zeros(2 + 5 * CAP, dtype=torch.int64)
    buf[0] = len(rows)
    buf[1 + CAP : 1 + CAP + BS] = torch.tensor([*rows, 3, 3])
    return SimpleNamespace(count=buf[0], rows=buf[1 + CAP : 1 + 2 * CAP])


@pytest.mark.parametrize("chunk_rows", [None, 3], ids=["one_chunk", "chunks_of_3"])
@pytest.mark.parametrize(
    "params", [PLAIN, MASKED, PENALIZED, BOTH], ids=["plain", "masked", "penalized", "both"]
)
def test_commit_sampled_draws_what_the_eager_sampler_draws(
    params: list[SamplingParams], chunk_rows: int | None
) -> None:
    """Also with the graph's sampler working through its 6 rows 3 at a time (a large
    vocabulary's chunks): the same tokens and counts as the eager sampler in one go."""
    n = len(ROWS)
    seen = [(r, [1, 2, 3 + i]) if p.uses_penalties else None for i, (r, p) in enumerate(zip(ROWS, params))]
    first = SamplingInputs.from_requests(
        ROWS, params, [0] * n, [frozenset()] * n, penalty_init=[s for s in seen if s is not None]
    )
    assert SampledGraphs.can_sample(first)
    top_k_p, penalties = bool(first.flags & TOP_K_P), bool(first.flags & PENALTIES)
    graph, eager = Sampler(V, CAP, CPU), Sampler(V, CAP, CPU)
    graph.chunk_rows = chunk_rows or graph.chunk_rows
    graph.prepare(first)  # what SampledGraphs.run queues before its replay
    staging = _staging(ROWS)
    last = torch.full((CAP + 1,), -7, dtype=torch.int64)  # the last entry is the scratch
    out = torch.zeros(CAP, dtype=torch.int64)
    gen = torch.Generator().manual_seed(len(params))
    rows_t = torch.tensor(ROWS)
    for step in range(4):
        logits = torch.randn(BS, V + 6, generator=gen) * 2
        logits[:, V:] = 100.0  # past the vocabulary (a padded lm_head): never chosen
        if step == 2:
            logits[1, 4] = float("nan")  # a broken row: INVALID_TOKEN, and 0 for the next input
        positions = torch.tensor([20 + step, 7 + step, 31 + step, 9 + step, 0, 0])
        commit_sampled(graph, logits, staging, positions, last, out, top_k_p, penalties)

        inp = first if step == 0 else SamplingInputs(np.array(ROWS), params, first.flags)
        want = eager(logits[:n], inp, rows_t, positions[:n]).next_ids
        assert out[:n].tolist() == want.tolist(), step
        assert step != 2 or want[1] == INVALID_TOKEN
        expect = torch.full((CAP,), -7)
        expect[rows_t] = want.clamp(min=0)
        assert torch.equal(last[:CAP], expect)  # row 3, the padding rows' stale row, untouched
        last[:CAP] = -7
    if penalties:
        assert graph.counts is not None and eager.counts is not None
        assert torch.equal(graph.counts[rows_t], eager.counts[rows_t])
        assert torch.equal(graph.seen[rows_t], eager.seen[rows_t])  # type: ignore[index]
        assert int(graph.counts[rows_t].sum()) == 4 * n  # one per draw (a broken row aborts anyway)
        assert int(graph.counts[3].sum()) == 0  # the padding's stale row: nothing counted


def test_min_p_off_and_on_draw_the_same_for_neutral_rows() -> None:
    """The graphs always apply min-p; eagerly a step without min-p rows skips it."""
    sampler = Sampler(V, CAP, CPU)
    n = len(PLAIN)
    inp = SamplingInputs.from_requests(ROWS, PLAIN, [0] * n, [frozenset()] * n)
    logits = torch.randn(n, V)
    positions = torch.arange(n) + 40
    eager = sampler(logits, inp, torch.tensor(ROWS), positions).next_ids
    graphed = sampler.sample_device(logits, torch.tensor(ROWS), positions, top_k_p=False, penalties=False)
    assert torch.equal(eager, graphed)


def test_steps_with_host_edits_or_logprobs_stay_eager() -> None:
    def inp(p: SamplingParams, num_output: int = 0) -> SamplingInputs:
        return SamplingInputs.from_requests([0], [p], [num_output], [frozenset({9})])

    assert SampledGraphs.can_sample(inp(SamplingParams(temperature=0.7, top_p=0.9, seed=1)))
    assert SampledGraphs.can_sample(inp(SamplingParams(temperature=0, presence_penalty=0.5)))
    assert not SampledGraphs.can_sample(inp(SamplingParams(temperature=0)))  # the greedy graphs' case
    assert not SampledGraphs.can_sample(inp(SamplingParams(logprobs=True)))
    assert not SampledGraphs.can_sample(inp(SamplingParams(logit_bias={3: 1.0})))
    assert not SampledGraphs.can_sample(inp(SamplingParams(min_tokens=2)))  # suppresses EOS now
    assert SampledGraphs.can_sample(inp(SamplingParams(min_tokens=2, max_tokens=9), 2))


def test_the_eager_sampler_in_row_chunks_draws_what_it_draws_in_one_go() -> None:
    """`Sampler.__call__` with penalties, top-k/top-p, min-p and logprobs, rows 2 at a time
    (`chunk_rows`, as a 262k vocabulary takes 64 at a time) against all at once."""
    params = [*MASKED, *PENALIZED]
    rows = list(range(len(params)))
    n = len(rows)
    seen = [(r, [1, 2, 3 + r]) for r, p in zip(rows, params) if p.uses_penalties]
    want_lp = [
        SamplingParams(temperature=p.temperature, seed=p.seed, logprobs=True, top_logprobs=2)
        for p in params[:2]
    ]
    params = [*want_lp, *params[2:]]
    chunked, whole = Sampler(V, n, CPU), Sampler(V, n, CPU)
    chunked.chunk_rows = 2
    gen = torch.Generator().manual_seed(0)
    for step in range(3):
        inp = SamplingInputs.from_requests(
            rows, params, [0] * n, [frozenset()] * n, penalty_init=seen if step == 0 else []
        )
        logits = torch.randn(n, V, generator=gen) * 2
        positions = torch.arange(n) + 10 * step
        a, b = chunked(logits, inp, None, positions), whole(logits, inp, None, positions)
        assert a.next_ids.tolist() == b.next_ids.tolist(), step
        assert a.logprobs is not None and b.logprobs is not None and torch.equal(a.logprobs, b.logprobs)
    assert chunked.counts is not None and whole.counts is not None
    assert torch.equal(chunked.counts, whole.counts) and int(whole.counts.sum()) > 0
