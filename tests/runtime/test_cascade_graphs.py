"""Cascade decode steps replayed from CUDA graphs (runtime/attention/triton_cascade_graph.py)
give the eager cascade step's and the plain step's logits, over steps whose groups change
between replays of one graph (GPU only)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from radixserve.model.loader import load_model
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.cuda_graph import DecodeGraphs
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.sampler import SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.runtime.step_batch import build_decode_batch

sys.path.insert(0, str(Path(__file__).parent))
from graph_cases import graph_side  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MAX_BS, CONTEXT, SLOTS = 8, 2048, 16384
# bf16 through 24 random layers, different split counts on each side: a few percent of
# rounding; a stale partial or a wrong row would be off by order one.
TOL = 8e-2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_cascade_graph_matches_eager_cascade_and_plain() -> None:
    pytest.importorskip("flashinfer")
    pytest.importorskip("triton")
    loaded = load_model("dummy:qwen2.5-0.5b", dtype=torch.bfloat16, device="cuda")
    cfg, model = loaded.config, loaded.model
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    sides = []
    for graphed in (True, False):
        _, table, attn = graph_side(cfg, MAX_BS, CONTEXT, SLOTS)  # the same random cache on both sides
        last = torch.arange(MAX_BS, device=device) * 7 + 3
        graphs = None
        if graphed:
            graphs = DecodeGraphs(
                model, attn, MAX_BS, MAX_BS * CONTEXT, SLOTS, device, (table.device_table, last), cascade=True
            )
            graphs.capture(torch.cuda.Stream())
            assert graphs.cascade and graphs.cascade_graphs
        sides.append((table, attn, graphs, last))

    # Batch rows 0-2 share a 1000-slot prefix, rows 3-4 a 300-slot one; each has its own tail.
    rows = np.array([6, 1, 3, 0, 4], dtype=np.int64)
    shared = {0: 1000, 1: 300}
    member = [0, 0, 0, 1, 1]
    own = rng.integers(1, 200, size=len(rows))
    free = iter(rng.permutation(SLOTS).tolist())
    prefixes = {g: [next(free) for _ in range(n)] for g, n in shared.items()}
    ctx = [prefixes[member[i]] + [next(free) for _ in range(int(own[i]))] for i in range(len(rows))]
    for table, *_ in sides:
        for r, c in zip(rows, ctx):
            table.write(int(r), 0, torch.tensor(c, dtype=torch.int32))
    torch.cuda.synchronize()
    prefix = np.array([len(c) for c in ctx], dtype=np.int64)
    both = CascadeGroups(((0, 1, 2), (3, 4)), (1000, 300))
    first = CascadeGroups(((0, 1, 2),), (1000,))
    stream = torch.cuda.Stream()
    for step, groups in enumerate([both, first, both]):  # the groups change between replays
        slots = np.array([next(free) for _ in rows], dtype=np.int64)
        ids = np.array([-1 if (i + step) % 2 else 100 + i for i in range(len(rows))], dtype=np.int64)
        inp = StepInput.decode(rows, prefix + step, slots, ids, SamplingInputs(rows, [], 0), groups)
        outs = []
        for table, attn, graphs, last in sides:
            with torch.cuda.stream(stream), torch.inference_mode():
                if graphs is not None:
                    assert graphs.can_run_decode(inp)
                    logits, got_rows = graphs.run_decode(inp)
                    assert got_rows.tolist() == rows.tolist()
                    outs.append(logits.float().clone())
                else:
                    fb = build_decode_batch(inp, table.device_table, last, device)
                    assert fb.cascade is not None  # the eager cascade step
                    attn.plan(fb)
                    outs.append(model(fb, attn).float())
                    plain = ForwardBatch(**{**fb.__dict__, "cascade": None})
                    attn.plan(plain)
                    outs.append(model(plain, attn).float())
            stream.synchronize()
        graph_out, eager_cascade, eager_plain = outs
        assert graph_out.shape == (len(rows), cfg.vocab_size)
        assert _rel(graph_out, eager_cascade) < TOL, (step, _rel(graph_out, eager_cascade))
        assert _rel(graph_out, eager_plain) < TOL, (step, _rel(graph_out, eager_plain))
    assert torch.equal(sides[0][0].device_table, sides[1][0].device_table)
