"""Decode graphs that build their own inputs (`step_fill` inside the graph) give the same
logits and the same device table as graphs fed by the host-built batch, and their greedy
graphs (greedy_graphs.py) sample the argmax into the step's rows alone (GPU only)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from radixserve.model.loader import load_model
from radixserve.runtime.cuda_graph import DecodeGraphs
from radixserve.runtime.greedy_graphs import GreedyGraphs
from radixserve.runtime.sampler import SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.runtime.step_batch import build_decode_batch

sys.path.insert(0, str(Path(__file__).parent))
from graph_cases import graph_side  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MAX_BS, CONTEXT, SLOTS = 8, 512, 8192


def test_graph_built_inputs_match_host_built() -> None:
    pytest.importorskip("flashinfer")
    pytest.importorskip("triton")
    loaded = load_model("dummy:qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda")
    cfg, model = loaded.config, loaded.model
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    sides = []
    for device_inputs in (True, False):
        pool, table, attn = graph_side(cfg, MAX_BS, CONTEXT, SLOTS)  # the same random cache on both sides
        planner = attn.decode_graphs()
        assert planner is not None and planner.device_planned
        last = torch.arange(MAX_BS + 1, device=device) * 7 + 3  # + the greedy graphs' scratch
        tables = (table.device_table, last) if device_inputs else None
        graphs = DecodeGraphs(model, attn, MAX_BS, MAX_BS * CONTEXT, SLOTS, device, tables)
        stream = torch.cuda.Stream()
        graphs.capture(stream)
        assert graphs.device_inputs == device_inputs
        if device_inputs:
            greedy = GreedyGraphs(graphs, cfg.vocab_size, last)
            greedy.capture(stream)
        sides.append((pool, table, graphs, last, stream))

    # Three steps of 5 requests (padded to the graph of 8) on scattered slots, some ids in flight.
    rows = np.array([6, 1, 3, 0, 4], dtype=np.int64)
    prefix = rng.integers(20, 300, size=len(rows))
    ctx = rng.permutation(SLOTS)[: int(prefix.sum()) + 3 * len(rows)].reshape(-1)
    for _, table, *_ in sides:
        off = 0
        for r, p in zip(rows, prefix):
            table.write(int(r), 0, torch.tensor(ctx[off : off + p], dtype=torch.int32))
            off += p
        torch.cuda.synchronize()
    start = int(prefix.sum())
    for step in range(3):
        slots = ctx[start : start + len(rows)].astype(np.int64)
        start += len(rows)
        ids = np.array([-1 if (i + step) % 2 else 100 + i for i in range(len(rows))], dtype=np.int64)
        inp = StepInput.decode(rows, prefix + step, slots, ids, SamplingInputs(rows, [], 0))
        outs = []
        for _pool, table, graphs, last, stream in sides:
            with torch.cuda.stream(stream), torch.inference_mode():
                if graphs.device_inputs:
                    assert graphs.can_run_decode(inp)
                    logits, got_rows = graphs.run_decode(inp)
                    assert got_rows.tolist() == rows.tolist()
                    before = last.clone()
                    ids = greedy.run(inp).clone()
                else:
                    fb = build_decode_batch(inp, table.device_table, last, device)
                    assert graphs.can_run(fb)
                    logits = graphs.run(fb)
                outs.append(logits.float().clone())
            stream.synchronize()
        # The greedy graph: the argmax of the step's logits, written to the step's rows only.
        assert ids.tolist() == outs[0].argmax(dim=-1).tolist()
        after, want = sides[0][3], before.clone()
        want[torch.as_tensor(rows, device=device)] = ids
        assert torch.equal(after[:MAX_BS], want[:MAX_BS])
        sides[1][3].copy_(after)  # the host-built side reads the same last tokens next step
        assert outs[0].shape[0] == len(rows)
        # The same kernels on the same inputs: equal up to nothing but kernel nondeterminism.
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-3, atol=1e-2)
    assert torch.equal(sides[0][1].device_table, sides[1][1].device_table)
    assert torch.equal(sides[0][0].k[0], sides[1][0].k[0])  # the same K written at the same slots
