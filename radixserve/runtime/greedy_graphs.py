"""Greedy sampling of graph-replayed decode steps, as CUDA graphs of their own.

An all-greedy decode step without logit edits, logprobs or rows taking their
parameters (`SamplingInputs.argmax_only`, no `init`) needs only the argmax of
its logits and those ids written where the next step reads them
(`ModelRunner.last_tokens`). Eagerly that is about six small launches, each
with its Python (slice, max, isfinite, where, clamp, index_put) on the worker
thread every step; here it is one replay of a graph captured over the decode
graph's static logits buffer (one per batch size, plain and cascade).

The graph also writes `last_tokens` for the step's real rows. It reads the
step's row count and rows from the step-fill staging buffer on the device
(runtime/step_fill.py), and sends the padding rows' writes to a scratch
entry: the last entry of `last_tokens`, one past the runner's rows.

Used only in device-input mode (`DecodeGraphs.device_inputs`), where the
staging buffer exists. The decode graphs stay unchanged, so steps that sample
any other way replay them as before and run the sampler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.runtime.sampler import greedy_argmax
from radixserve.runtime.step import StepInput

if TYPE_CHECKING:  # step_fill imports triton; greedy graphs exist only where it is installed
    from radixserve.runtime.cuda_graph import DecodeGraphs
    from radixserve.runtime.step_fill import StepFillStaging


def commit_greedy(
    logits: torch.Tensor,
    vocab_size: int,
    staging: StepFillStaging,
    last_tokens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """`out[:bs]` = the greedy ids of `logits` `[bs, >= vocab]`. `last_tokens[row]` = that id
    (clamped to >= 0) for each real row of the staging buffer; padding rows write the scratch
    entry `last_tokens[-1]`. No host reads, nothing allocated outside the capture."""
    bs = logits.shape[0]
    ids = greedy_argmax(logits, vocab_size)
    out[:bs].copy_(ids)
    real = torch.arange(bs, device=logits.device) < staging.count
    rows = torch.where(real, staging.rows[:bs], last_tokens.numel() - 1)
    last_tokens[rows] = ids.clamp(min=0)


class GreedyGraphs:
    """One greedy graph beside each decode graph of a `DecodeGraphs` in device-input mode."""

    def __init__(self, graphs: DecodeGraphs, vocab_size: int, last_tokens: torch.Tensor) -> None:
        if not graphs.device_inputs or graphs.staging is None:
            raise ValueError("greedy graphs read the step-fill staging: device-input mode only")
        self.staging = graphs.staging
        if last_tokens.numel() <= self.staging.cap:
            raise ValueError("last_tokens needs a scratch entry past the runner's rows")
        self.decode = graphs
        self.vocab_size = vocab_size
        self.last_tokens = last_tokens
        self.ids = torch.zeros(graphs.max_bs, dtype=torch.int64, device=last_tokens.device)
        self._graphs: dict[tuple[bool, int], torch.cuda.CUDAGraph] = {}

    def capture(self, stream: torch.cuda.Stream) -> None:
        """A graph per decode graph (plain, and cascade where captured). Before the first
        upload the staging holds zero requests, so warm-up and capture write only scratch."""
        pool = torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream(self.ids.device))
        for cascade, logits_by_bs in ((False, self.decode.logits), (True, self.decode.cascade_logits)):
            for bs, logits in logits_by_bs.items():
                with torch.cuda.stream(stream):
                    self._commit(logits)  # warm-up: lazy inits outside the capture
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self._commit(logits)
                self._graphs[(cascade, bs)] = graph
        torch.cuda.synchronize(self.ids.device)

    def _commit(self, logits: torch.Tensor) -> None:
        commit_greedy(logits, self.vocab_size, self.staging, self.last_tokens, self.ids)

    def run(self, inp: StepInput) -> torch.Tensor:
        """The greedy ids `[B]` of the step `DecodeGraphs.run_decode(inp)` just enqueued, with
        `last_tokens` of its rows written; on the current stream, after that replay."""
        b = inp.batch_size
        self._graphs[(inp.cascade is not None, self.decode.graph_size(b))].replay()
        return self.ids[:b]
