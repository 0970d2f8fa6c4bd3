"""`ModelRunner`: one forward + sample per step, launched without waiting.

`launch(step)` enqueues the whole step (a `StepInput`, runtime/step.py) on the
runner's CUDA stream (on the CPU it simply runs) and returns a `StepHandle` at
once. The step's forward batch is made here (runtime/step_batch.py): a decode
step's on the device from the device copy of the request-to-slot table, or by
the fill kernel of a CUDA graph that replays it; the fast paths (decode
graphs, greedy and sampled graphs, cascade graphs, extend graphs) are this
class's choice per step, not layouts the scheduler knows of. The sampled ids land in an
on-device buffer indexed by request row, from which the next step takes the
input token of every request whose previous token is still in flight; their
host copy is started without blocking and read by `StepHandle.result()`, the one
device-to-host sync per step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from radixserve.host_copy import to_device
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.attention.warm_batches import tiny_batch
from radixserve.runtime.cuda_graph import DecodeGraphs, supports_graphs
from radixserve.runtime.extend_graphs import ExtendGraphs
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.greedy_graphs import GreedyGraphs
from radixserve.runtime.sampled_graphs import SampledGraphs
from radixserve.runtime.sampler import SampleOutput, Sampler, SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.runtime.step_batch import build_forward_batch
from radixserve.runtime.warm_up import KernelBuild, run_builds

# (step number from 1, logits [rows, vocab], the step's sampling inputs) -> logits to use
FaultHook = Callable[[int, torch.Tensor, SamplingInputs], torch.Tensor]


@dataclass
class StepHandle:
    """Host tensors being filled by the device, and the event that says when they are."""

    next_ids: torch.Tensor  # [n] int64 (host)
    event: torch.cuda.Event | None
    logprobs: torch.Tensor | None = None  # [n]
    top_ids: torch.Tensor | None = None  # [n, k]
    top_logprobs: torch.Tensor | None = None
    prompt_lps: torch.Tensor | None = None  # [m] logprob of each prompt target
    prompt_top_ids: torch.Tensor | None = None
    prompt_top_lps: torch.Tensor | None = None

    def result(self) -> StepResult:
        """Wait for the device (the step's one sync), then read the host copies."""
        if self.event is not None:
            self.event.synchronize()
        res = StepResult(next_ids=self.next_ids.tolist())
        if self.logprobs is not None:
            res.logprobs = self.logprobs.tolist()
            if self.top_ids is not None and self.top_logprobs is not None:
                res.top = [
                    list(zip(i, lp)) for i, lp in zip(self.top_ids.tolist(), self.top_logprobs.tolist())
                ]
        if self.prompt_lps is not None:
            lps = self.prompt_lps.tolist()
            tops: list[list[tuple[int, float]]] = [[] for _ in lps]
            if self.prompt_top_ids is not None and self.prompt_top_lps is not None:
                tops = [
                    list(zip(i, lp))
                    for i, lp in zip(self.prompt_top_ids.tolist(), self.prompt_top_lps.tolist())
                ]
            res.prompt_lps = list(zip(lps, tops))
        return res


@dataclass
class Forwarded:
    """A step whose forward pass is enqueued and whose sampling is not (yet)."""

    logits: torch.Tensor
    sampling: SamplingInputs
    prompt_lp_targets: list[int] | None
    prompt_top_k: int
    rows: torch.Tensor | None = None  # the sampling rows on the device, when the forward had them
    # [n] int64 on the device: the position of each sampling row's last input token (keys its noise)
    positions: torch.Tensor | None = None
    # The decode inputs of a step the decode graphs ran (`run_decode`): its greedy or sampled
    # graph can sample it.
    graph_decode: StepInput | None = None


@dataclass
class StepResult:
    """What one step produced, on the host."""

    next_ids: list[int]
    logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None  # per sampled token: (id, logprob), best first
    prompt_lps: list[tuple[float, list[tuple[int, float]]]] | None = None  # per prompt-logprob row


class ModelRunner:
    def __init__(
        self,
        model: nn.Module,
        attn: AttentionBackend,
        vocab_size: int,
        max_rows: int,
        device: torch.device,
        slot_table: torch.Tensor | None = None,
    ) -> None:
        """`slot_table`: the device copy of the request-to-slot table
        (`ReqToSlotTable.device_table`), which decode steps read and extend."""
        self.model = model
        self.slot_table = slot_table
        self.attn = attn
        self.device = device
        self.sampler = Sampler(vocab_size, max_rows, device)
        # One entry past the rows: the scratch that graph padding rows write (greedy_graphs.py).
        self.last_tokens = torch.zeros(max_rows + 1, dtype=torch.int64, device=device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.graphs: DecodeGraphs | None = None
        self.greedy_graphs: GreedyGraphs | None = None
        self.sampled_graphs: SampledGraphs | None = None
        self.extend_graphs: ExtendGraphs | None = None
        # Test hook (radixserve.testing.inject_faults): sees each step's logits, may raise or edit them.
        self.fault_hook: FaultHook | None = None
        self.launches = 0

    def warm_up(self, builds: list[KernelBuild]) -> float:
        """Build every kernel the steps will run, before the first one and before graph capture
        (runtime/warm_up.py): `builds` (the attention backend's and the layer kernels'), then on
        CUDA one tiny eager extend and decode step of the whole model, for whatever else compiles
        there (fused MoE, FP8 GEMMs). The seconds it took."""
        if self.device.type == "cuda":
            builds = [*builds, KernelBuild("model step (tiny extend and decode)", self._tiny_steps)]
        return run_builds(builds, self.device)

    @torch.inference_mode()
    def _tiny_steps(self) -> None:
        for step in ("extend", "decode"):
            batch = tiny_batch(self.attn, step)
            self.attn.plan(batch)
            self.model(batch, self.attn)

    def enable_cuda_graphs(
        self,
        max_bs: int,
        max_kv_tokens: int,
        scratch_slot: int,
        extend_tokens: int = 0,
        cascade: bool = False,
    ) -> bool:
        """Capture decode graphs (CUDA and a graph-capable backend only), and extend graphs
        for steps of up to `extend_tokens` new tokens where the backend runs them; with
        `cascade`, graphs for shared-prefix decode steps too, where the backend has them.
        True if done."""
        if self.stream is None or not supports_graphs(self.attn):
            return False
        pool = torch.cuda.graph_pool_handle()  # one pool: only one graph replays at a time
        if extend_tokens > 0 and self.attn.graph_extend:
            self.extend_graphs = ExtendGraphs(
                self.model, self.attn, max_bs, extend_tokens, max_kv_tokens, scratch_slot, self.device
            )
            self.extend_graphs.capture(self.stream, pool)  # first: the largest activations
        tables = None if self.slot_table is None else (self.slot_table, self.last_tokens)
        self.graphs = DecodeGraphs(
            self.model, self.attn, max_bs, max_kv_tokens, scratch_slot, self.device, tables, cascade
        )
        self.graphs.capture(self.stream, pool)
        if self.graphs.device_inputs:
            self.greedy_graphs = GreedyGraphs(self.graphs, self.sampler.vocab_size, self.last_tokens)
            self.greedy_graphs.capture(self.stream)
            self.sampled_graphs = SampledGraphs(self.graphs, self.sampler, self.last_tokens)
            self.sampled_graphs.capture(self.stream, pool)
        return True

    def launch(self, step: StepInput) -> StepHandle:
        return self.sample(self.forward(step))

    def forward(self, step: StepInput) -> Forwarded:
        """Enqueue the forward pass only; `sample()` finishes the step (structured output
        fills its bitmask in between, once the previous step's tokens are known)."""
        with self._on_stream():
            logits, rows, positions, graph_decode = self._forward(step)
            self.launches += 1
            if self.fault_hook is not None:  # tests: radixserve.testing.inject_faults
                logits = self.fault_hook(self.launches, logits, step.sampling)
                graph_decode = None  # the hook's logits, not the graph's buffer, are the step's
        return Forwarded(
            logits, step.sampling, step.prompt_lp_targets, step.prompt_top_k, rows, positions, graph_decode
        )

    def sample(
        self, fwd: Forwarded, bitmask: torch.Tensor | None = None, bitmask_rows: list[int] | None = None
    ) -> StepHandle:
        """Sample the forwarded step; `bitmask` (host, xgrammar layout) masks `bitmask_rows`."""
        if bitmask is not None:
            fwd.sampling.bitmask, fwd.sampling.bitmask_rows = bitmask, bitmask_rows
        with self._on_stream():
            graphed = self._graph_sample(fwd)
            if graphed is not None:
                return self._handle(StepHandle(next_ids=_to_host(graphed), event=None))
            return self._sample(fwd)

    @torch.inference_mode()
    def _graph_sample(self, fwd: Forwarded) -> torch.Tensor | None:
        """The step's ids from a graph when the decode graphs ran it and its sampling needs no
        host work: its greedy graph (greedy_graphs.py) when argmax is all it asks, else its
        sampled graph (sampled_graphs.py); None: the eager sampler's turn."""
        s, step = fwd.sampling, fwd.graph_decode
        if step is None or fwd.prompt_lp_targets or len(s) != step.batch_size:
            return None
        if self.greedy_graphs is not None and s.argmax_only:
            self.sampler.prepare(s)  # rows taking their parameters now: written for later steps
            return self.greedy_graphs.run(step)
        if self.sampled_graphs is not None and SampledGraphs.can_sample(s):
            return self.sampled_graphs.run(step)
        return None

    def _handle(self, handle: StepHandle) -> StepHandle:
        """`handle` with the event that says when its host copies are filled (CUDA)."""
        if self.device.type == "cuda":
            handle.event = torch.cuda.Event()
            handle.event.record()
        return handle

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    @torch.inference_mode()
    def _forward(
        self, step: StepInput
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, StepInput | None]:
        """(logits, the sampling rows on the device or None, their positions on the device, the
        step if the decode graphs ran it)."""
        if self.graphs is not None and self.graphs.can_run_decode(step):
            logits, rows = self.graphs.run_decode(step)  # inputs built inside the graph
            return logits, rows, self.graphs.positions[: step.batch_size], step
        fb = build_forward_batch(step, self.slot_table, self.last_tokens, self.device)
        # Only sampled rows key noise by position: an all-greedy step skips the gather.
        positions = None if step.sampling.all_greedy else _sampled_positions(fb, len(step.sampling))
        if not step.is_decode and self.extend_graphs is not None and self.extend_graphs.can_run(fb):
            return self.extend_graphs.run(fb), fb.rows, positions, None
        if self.graphs is not None and self.graphs.can_run(fb):
            return self.graphs.run(fb), fb.rows, positions, None
        self.attn.plan(fb)
        return self.model(fb, self.attn), fb.rows, positions, None

    @torch.inference_mode()
    def _sample(self, fwd: Forwarded) -> StepHandle:
        logits, sampling, prompt_lp_targets = fwd.logits, fwd.sampling, fwd.prompt_lp_targets
        n = len(sampling)
        empty = SampleOutput(torch.empty(0, dtype=torch.int64))
        out = self.sampler(logits[:n], sampling, fwd.rows, fwd.positions) if n else empty
        if n:
            # An invalid id (-1, NaN logits) must not index the embedding of the next step.
            self.last_tokens[out.rows] = out.next_ids.clamp(min=0)
        handle = StepHandle(next_ids=_to_host(out.next_ids), event=None)
        if out.logprobs is not None:
            handle.logprobs = _to_host(out.logprobs)
            if out.top_ids is not None:
                handle.top_ids = _to_host(out.top_ids)
                handle.top_logprobs = _to_host(out.top_logprobs)
        if prompt_lp_targets:
            lp = torch.log_softmax(logits[n:].float(), dim=-1)
            tgt = to_device(prompt_lp_targets, torch.int64, self.device)
            handle.prompt_lps = _to_host(lp.gather(1, tgt[:, None])[:, 0])
            if fwd.prompt_top_k:
                top_lps, top_ids = lp.topk(fwd.prompt_top_k, dim=-1)
                handle.prompt_top_ids, handle.prompt_top_lps = _to_host(top_ids), _to_host(top_lps)
        return self._handle(handle)


def _sampled_positions(fb: ForwardBatch, n: int) -> torch.Tensor:
    """[n] the positions of the sampling rows' last input tokens: the first n logit rows (or
    each request's last token), gathered on the device."""
    rows = fb.logit_rows[:n] if fb.logit_rows is not None else fb.last_token_rows()[:n]
    return fb.positions[rows]


def _to_host(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None
    if t.device.type == "cpu":
        return t.clone()
    return t.to("cpu", non_blocking=True)
