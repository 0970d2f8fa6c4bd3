"""Cases for the one-launch decode fill (radixserve/runtime/step_fill.py) against the torch path.

`run_step_fill_cases` runs the kernel on the CPU under TRITON_INTERPRET=1 and returns, per
case, the fields where it differs from `build_decode_batch` followed by `DecodeGraphs.run`'s
padding (empty: equal). The tests run it in a subprocess (interpreted_cases.py) so that the
interpreter flag never reaches the test process.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from radixserve.runtime.cuda_graph import DecodeGraphs
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.sampler import SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.runtime.step_batch import build_decode_batch

SCRATCH = 99_999
MAX_CONTEXT = 256


@dataclass(frozen=True)
class Case:
    name: str
    n: int  # real requests
    prefix_lens: tuple[int, ...] | None = None  # None: random in [0, 60]
    cap: int = 16  # packed capacity, also the largest graph
    block: int = 16  # the kernel's copy tile: contexts longer than it take several iterations


# Graph sizes come from DecodeGraphs' own ladder for cap 16: 1, 2, 4, 8, 12, 16.
CASES = [
    Case("random_pad", 11),  # graph 12: one padding row
    Case("random_pad_many", 5),  # graph 8: three padding rows
    Case("one_request", 1),  # graph 1: no padding
    Case("full", 16),  # n == cap
    # tile edges: empty prefix, one short of / exactly / one past a tile, many tiles
    Case("long_contexts", 7, (0, 15, 16, 17, 200, 255, 64)),
]


class _RecordingAttention:
    """Stands in for FlashInfer's decode: keeps the batch `DecodeGraphs.run` plans the graph with."""

    device_planned = False  # host-planned: `DecodeGraphs.run` is the path under test
    cascade_graphs = False

    def __init__(self) -> None:
        self.planned: ForwardBatch | None = None

    def decode_graphs(self) -> _RecordingAttention:
        return self

    def make_cuda_graph_decode_state(self, bs: int, max_kv_tokens: int) -> None:
        return None

    def plan_cuda_graph(self, state: Any, batch: ForwardBatch) -> None:
        self.planned = batch


def _inputs(case: Case, rng: random.Random) -> tuple[StepInput, torch.Tensor, torch.Tensor]:
    """Random decode inputs, a random table (garbage beyond each prefix) and last tokens."""
    rows = rng.sample(range(case.cap), case.n)
    prefix = list(case.prefix_lens) if case.prefix_lens else [rng.randint(0, 60) for _ in rows]
    slots = rng.sample(range(SCRATCH), case.n)
    ids = [rng.choice([-1, rng.randrange(1000)]) for _ in rows]
    ids[0] = -1  # every case takes at least one id from the device
    rows_a, prefix_a, slots_a, ids_a = (np.array(a, dtype=np.int64) for a in (rows, prefix, slots, ids))
    inp = StepInput.decode(rows_a, prefix_a, slots_a, ids_a, SamplingInputs(rows_a, [], 0))
    table = torch.randint(0, SCRATCH, (case.cap, MAX_CONTEXT), dtype=torch.int32)
    last = torch.randint(0, 1000, (case.cap,), dtype=torch.int64)
    return inp, table, last


def _reference(case: Case, inp: StepInput, table: torch.Tensor, last: torch.Tensor) -> dict[str, Any]:
    """The torch path: `build_decode_batch`, then `DecodeGraphs.run` with a stand-in graph."""
    attn = _RecordingAttention()
    graphs = DecodeGraphs(torch.nn.Identity(), attn, case.cap, 4096, SCRATCH, torch.device("cpu"))  # type: ignore[arg-type]
    bs = next(s for s in graphs.sizes if s >= case.n)
    graphs.graphs[bs] = SimpleNamespace(replay=lambda: None)  # type: ignore[assignment]
    graphs.logits[bs] = torch.zeros(bs, 1)
    graphs.states[bs] = None
    fb = build_decode_batch(inp, table, last, torch.device("cpu"))
    graphs.run(fb)
    planned = attn.planned
    assert planned is not None
    lens = torch.tensor(planned.prefix_lens) + 1
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
    assert torch.equal(indptr[: case.n + 1], fb.kv_indptr)  # the real rows' device indptr agrees
    return {
        "bs": bs,
        "input_ids": planned.input_ids,
        "positions": planned.positions,
        "out_slots": planned.out_slots,
        "kv_indptr": indptr,  # what the plan is built from: prefix_lens padded with 0
        "kv_indices": planned.kv_indices,
        "table": table,
        "rows": fb.rows,
    }


def _kernel(
    case: Case, bs: int, inp: StepInput, table: torch.Tensor, last: torch.Tensor, device: torch.device
) -> dict[str, Any]:
    from radixserve.runtime.step_fill import StepFillStaging, step_fill

    staging = StepFillStaging(case.cap, device)
    staging.device_buf.fill_(-7)  # stale entries beyond n must not matter
    packed = staging.upload(inp)
    total = int(inp.prefix_lens.sum()) + bs
    # Buffers prefilled with garbage, larger than needed, as a graph's static buffers are.
    out = {
        "input_ids": torch.full((bs,), -5, dtype=torch.int64, device=device),
        "positions": torch.full((bs,), -5, dtype=torch.int64, device=device),
        "out_slots": torch.full((bs,), -5, dtype=torch.int64, device=device),
        "kv_indptr": torch.full((bs + 1,), -5, dtype=torch.int32, device=device),
        "kv_indices": torch.full((total + 9,), -5, dtype=torch.int32, device=device),
    }
    table, last = table.to(device), last.to(device)
    step_fill(packed, case.cap, last, table, **out, scratch=SCRATCH, block=case.block)
    assert torch.all(out["kv_indices"][total:] == -5), "wrote past the step's context"
    out["kv_indices"] = out["kv_indices"][:total]
    got = {**out, "table": table, "rows": staging.rows[: case.n]}
    return {k: v.cpu() for k, v in got.items()}


def run_step_fill_cases(seed: int, device: str = "cpu") -> dict[str, list[str]]:
    """CPU: under TRITON_INTERPRET=1; CUDA: the compiled kernel (`-m gpu`)."""
    if device == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    rng = random.Random(seed)
    torch.manual_seed(seed)
    diffs: dict[str, list[str]] = {}
    for case in CASES:
        inp, table, last = _inputs(case, rng)
        want = _reference(case, inp, table.clone(), last)
        got = _kernel(case, want["bs"], inp, table.clone(), last, torch.device(device))
        diffs[case.name] = [
            k
            for k, g in got.items()
            if g.dtype != want[k].dtype or g.shape != want[k].shape or not torch.equal(g, want[k])
        ]
    return diffs
