"""Greedy sampling of graph-replayed decode steps (radixserve/runtime/greedy_graphs.py).

What its graphs run, `commit_greedy`, on the CPU against the sampler's greedy path; the
captured graphs themselves run on the GPU in test_graph_inputs.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from radixserve.runtime.greedy_graphs import commit_greedy
from radixserve.runtime.sampler import INVALID_TOKEN, Sampler, SamplingInputs
from radixserve.sampling_params import SamplingParams


def test_commit_greedy_writes_the_ids_and_only_the_real_rows() -> None:
    cap, bs, vocab = 8, 6, 50
    rows = [5, 0, 2, 7]  # the step's real rows; rows 6 and 7 of the graph are padding
    logits = torch.randn(bs, vocab + 14, generator=torch.Generator().manual_seed(0))
    logits[:, vocab:] = 100.0  # past the vocabulary (a padded lm_head): never chosen
    logits[1, 3] = float("nan")  # a broken row: INVALID_TOKEN, and 0 for the next step's input
    # The step-fill staging layout: [n, ids[cap], rows[cap], ...]; padding rows hold stale rows.
    buf = torch.zeros(2 + 5 * cap, dtype=torch.int64)
    buf[0] = len(rows)
    buf[1 + cap : 1 + cap + bs] = torch.tensor([*rows, 3, 3])
    staging = SimpleNamespace(count=buf[0], rows=buf[1 + cap : 1 + 2 * cap])
    last = torch.full((cap + 1,), -7, dtype=torch.int64)  # the last entry is the scratch
    out = torch.zeros(cap, dtype=torch.int64)

    commit_greedy(logits, vocab, staging, last, out)

    inp = SamplingInputs(rows=np.array([*rows, 3, 3]), params=[SamplingParams(temperature=0.0)] * bs, flags=0)
    assert inp.argmax_only
    want = Sampler(vocab, cap, torch.device("cpu"))(logits, inp).next_ids.tolist()
    assert out[:bs].tolist() == want
    assert want[1] == INVALID_TOKEN and all(0 <= t < vocab for i, t in enumerate(want) if i != 1)
    expect = [-7] * cap
    for i, r in enumerate(rows):
        expect[r] = max(want[i], 0)
    assert last[:cap].tolist() == expect  # row 3, the padding rows' stale row, untouched
