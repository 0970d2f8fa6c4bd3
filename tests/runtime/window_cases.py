"""Sliding windows and logit soft-capping in the Triton kernels, against the torch reference
(which computes both as transformers does).

`run_window_cases` runs under TRITON_INTERPRET=1 in interpreted_cases.py's subprocess; each
case goes through the Triton backend (eager, and extend steps also with the tile table that
graph-replayed steps use) and, for decode cases, through the hybrid that "flashinfer" builds
for such models (its Triton decode half, eager and as a CUDA-graph decode state run without
the graph). Layer 0 has the window, layer 1 the other (or none): layers alternate as in Gemma.
Sizes are tiny for the interpreter; its tiles are 16 keys and 16 queries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from attention_cases import Case, clone_pool, compare, graph_inputs, make_pool_and_batch

from radixserve.runtime.attention import AttentionOptions, make_attention_backend
from radixserve.runtime.attention.tiling import DecodeTiling


@dataclass(frozen=True)
class WindowCase:
    case: Case
    windows: tuple[int | None, ...]  # per layer; () for none
    softcap: float | None = None

    @property
    def options(self) -> AttentionOptions:
        return AttentionOptions(self.windows, self.softcap)


# Soft-caps of 1-2 against logits of about unit size: tanh bends them, so a kernel that skipped
# the cap would miss by far more than the bound.
WINDOW_CASES = [
    # Prompts longer than the window (8), beside a prefix or not, a decode row in the batch: later
    # query blocks skip whole key tiles, boundary tiles are masked.
    WindowCase(Case("extend_prefix_gqa", 4, 2, 64, (20, 0, 37), (13, 25, 1)), (8, None), 1.0),
    # Windows larger than every sequence: the switch on, nothing cut.
    WindowCase(Case("window_over_seq", 4, 1, 32, (3, 0), (9, 14)), (64, 40)),
    # Gemma's head size; a window on a tile edge; the soft-cap on both layers.
    WindowCase(Case("gemma_d256", 2, 1, 256, (5, 30), (20, 3)), (16, None), 2.0),
    # Decode, 3 splits over each window (24) rather than over the whole context.
    WindowCase(Case("decode_split3", 4, 2, 64, (0, 40, 70, 9), (1,) * 4, decode_splits=3), (24, None), 2.0),
    # The soft-cap alone, in float16.
    WindowCase(Case("decode_fp16_softcap", 4, 2, 64, (30, 5), (1, 1), dtype=torch.float16), (), 1.5),
    WindowCase(Case("extend_fp16_window", 4, 2, 64, (10, 0), (22, 17), dtype=torch.float16), (5, 12)),
]


def _triton(name: str, wc: WindowCase) -> dict[str, dict[str, float]]:
    case = wc.case
    pool, batch = make_pool_and_batch(case, "cpu")
    ref_pool = clone_pool(pool)
    args = (case.num_heads, case.num_kv_heads, case.head_dim, case.head_dim**-0.5)
    backend = make_attention_backend("triton", pool, *args, options=wc.options)
    backend.decode_splits = case.decode_splits  # type: ignore[attr-defined]
    out = {name: compare(case, backend, ref_pool, batch, wc.options)}
    if not case.is_decode:  # as a graph-replayed extend step runs it
        pool, batch = make_pool_and_batch(case, "cpu")
        ref_pool = clone_pool(pool)
        batch.graph = graph_inputs(batch)
        backend.pool = pool
        out[name + "_tiled"] = compare(case, backend, ref_pool, batch, wc.options)
    return out


def _hybrid(name: str, wc: WindowCase) -> dict[str, dict[str, float]]:
    """The decode half of "flashinfer" for this model: eagerly, then as a graph state."""
    case = wc.case
    out = {}
    args = (case.num_heads, case.num_kv_heads, case.head_dim, case.head_dim**-0.5)
    for graph in (False, True):
        pool, batch = make_pool_and_batch(case, "cpu")
        ref_pool = clone_pool(pool)
        hybrid = make_attention_backend("flashinfer", pool, *args, options=wc.options)
        assert hybrid.name == "triton-hybrid", hybrid.name
        if not graph:
            out[name + "_hybrid"] = compare(case, hybrid, ref_pool, batch, wc.options)
            continue
        planner = hybrid.decode_graphs()
        assert planner is not None
        state = planner.make_cuda_graph_decode_state(batch.batch_size, batch.kv_indices.numel() + 5)
        state.tiling = DecodeTiling(2, 16)  # type: ignore[attr-defined]  # the CPU's split rule says 1
        planner.plan_cuda_graph(state, batch)
        out[name + "_graph_state"] = compare(case, hybrid, ref_pool, batch, wc.options, planned=True)
    return out


def run_window_cases() -> dict[str, dict[str, float]]:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    results: dict[str, dict[str, float]] = {}
    for wc in WINDOW_CASES:
        name = wc.case.name
        results.update(_triton(name, wc))
        if wc.case.is_decode:
            results.update(_hybrid(name, wc))
    return results


def result_names(wc: WindowCase) -> list[str]:
    """The results `run_window_cases` gives for a case."""
    name = wc.case.name
    if wc.case.is_decode:
        return [name, name + "_hybrid", name + "_graph_state"]
    return [name, name + "_tiled"]
