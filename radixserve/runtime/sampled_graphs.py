"""Sampling of graph-replayed decode steps, as CUDA graphs of their own: the non-greedy twin of
runtime/greedy_graphs.py.

A decode step whose sampling is all per-row device state (`SamplingInputs.device_only`:
temperature, top-k, top-p, min-p, seeds, penalties; no logit bias, min_tokens
suppression, grammar bitmask or logprobs, whose inputs the host lists each step)
replays one graph captured over the decode graph's static logits buffer: the
sampler's device half (`Sampler.sample_device`: penalties, temperature,
masks, the counter-based exponential race, the penalty counts) and the write
of the ids where the next step reads them (`ModelRunner.last_tokens`).

The graph reads the step's row count and rows from the step-fill staging
buffer and its positions from the decode graph's positions buffer (both
written inside the decode graph by `step_fill`), so it reads nothing from the
host. Padding rows are sent to the scratch row (`Sampler.max_rows`, the last
entry of `last_tokens`): they draw from neutral parameters and count nothing
that a request reads. Rows that take their parameters this step have them
written first (`Sampler.prepare`, queued before the replay).

Graphs per batch size, for plain and cascade decode graphs: with and without
the sort of top-k/top-p, and with and without penalties (which need the
sampler's per-row counts, allocated at capture: (max_rows + 1) x vocab x 5
bytes). Min-p is always applied (neutral at 0), so the eager sampler, which
applies only what a step's flags ask, draws the same tokens (sample_ops.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.runtime.sampler import PENALTIES, TOP_K_P, Sampler, SamplingInputs
from radixserve.runtime.step import StepInput

if TYPE_CHECKING:  # step_fill imports triton; sampled graphs exist only where it is installed
    from torch.cuda import _POOL_HANDLE

    from radixserve.runtime.cuda_graph import DecodeGraphs
    from radixserve.runtime.step_fill import StepFillStaging

VARIANTS = ((False, False), (True, False), (False, True), (True, True))  # (top_k_p, penalties)


def commit_sampled(
    sampler: Sampler,
    logits: torch.Tensor,
    staging: StepFillStaging,
    positions: torch.Tensor,
    last_tokens: torch.Tensor,
    out: torch.Tensor,
    top_k_p: bool,
    penalties: bool,
) -> None:
    """`out[:bs]` = the sampled ids of `logits` `[bs, >= vocab]` for the staging buffer's rows at
    `positions` [bs]; `last_tokens[row]` = that id (clamped to >= 0) for each real row, the
    scratch entry for padding rows. No host reads, nothing allocated outside the capture."""
    bs = logits.shape[0]
    real = torch.arange(bs, device=logits.device) < staging.count
    rows = torch.where(real, staging.rows[:bs], sampler.max_rows)
    ids = sampler.sample_device(logits, rows, positions, top_k_p, penalties)
    out[:bs].copy_(ids)
    last_tokens[rows] = ids.clamp(min=0)


class SampledGraphs:
    """Sampled graphs beside each decode graph of a `DecodeGraphs` in device-input mode."""

    def __init__(self, graphs: DecodeGraphs, sampler: Sampler, last_tokens: torch.Tensor) -> None:
        if not graphs.device_inputs or graphs.staging is None:
            raise ValueError("sampled graphs read the step-fill staging: device-input mode only")
        if last_tokens.numel() != sampler.max_rows + 1 or sampler.max_rows < graphs.staging.cap:
            raise ValueError("last_tokens and the sampler need one scratch row past the runner's rows")
        self.staging = graphs.staging
        self.decode = graphs
        self.sampler = sampler
        self.last_tokens = last_tokens
        self.ids = torch.zeros(graphs.max_bs, dtype=torch.int64, device=last_tokens.device)
        self._graphs: dict[tuple[bool, int, bool, bool], torch.cuda.CUDAGraph] = {}
        self.replays = 0  # tests: how many steps a sampled graph drew

    @staticmethod
    def can_sample(s: SamplingInputs) -> bool:
        """Whether a graph can draw this step's tokens (the decode graphs ran its forward)."""
        return s.device_only and not s.argmax_only

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream, pool: _POOL_HANDLE) -> None:
        """Every variant per decode graph (plain, and cascade where captured). Before the first
        upload the staging holds zero requests, so warm-up and capture touch only scratch."""
        self.sampler.ensure_penalty_state()
        stream.wait_stream(torch.cuda.current_stream(self.ids.device))
        cases = [
            (cascade, bs, logits, top_k_p, penalties)
            for cascade, logits_by_bs in ((False, self.decode.logits), (True, self.decode.cascade_logits))
            for bs, logits in logits_by_bs.items()
            for top_k_p, penalties in VARIANTS
        ]
        with torch.cuda.stream(stream):
            for _, _, logits, top_k_p, penalties in cases:
                self._commit(logits, top_k_p, penalties)  # warm-up: lazy inits outside the graphs
        stream.synchronize()
        # The warm-ups' workspace (GiBs at a full batch of a large vocabulary) goes back to the
        # device, where the captures' private pool can take it: the engine set aside one
        # workspace for sampling (runtime/workspace.py), not one per pool.
        torch.cuda.empty_cache()
        for cascade, bs, logits, top_k_p, penalties in cases:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._commit(logits, top_k_p, penalties)
            self._graphs[(cascade, bs, top_k_p, penalties)] = graph
        torch.cuda.synchronize(self.ids.device)

    def _commit(self, logits: torch.Tensor, top_k_p: bool, penalties: bool) -> None:
        bs = logits.shape[0]
        positions = self.decode.positions[:bs]
        commit_sampled(
            self.sampler, logits, self.staging, positions, self.last_tokens, self.ids, top_k_p, penalties
        )

    def run(self, inp: StepInput) -> torch.Tensor:
        """The sampled ids `[B]` of the step `DecodeGraphs.run_decode(inp)` just enqueued, with
        `last_tokens` of its rows written; on the current stream, after that replay."""
        s, b = inp.sampling, inp.batch_size
        self.sampler.prepare(s)
        key = (
            inp.cascade is not None,
            self.decode.graph_size(b),
            bool(s.flags & TOP_K_P),
            bool(s.flags & PENALTIES),
        )
        self._graphs[key].replay()
        self.replays += 1
        return self.ids[:b]
