"""CUDA graphs for decode steps: capture once at start, replay every step.

A decode step of a small model is hundreds of tiny kernel launches; replaying
a captured graph turns them into one launch, so the GPU no longer waits for
Python. Graphs are captured for a ladder of batch sizes; a step of B requests
replays the smallest graph of at least B rows, padding the rest. Padding rows
read and write one scratch KV slot that belongs to no request (the pool has
one slot more than the allocator hands out).

Only backends that can plan a fixed-size decode state outside the graph take
part: those whose `decode_graphs()` gives a `DecodeGraphPlanner`
(`make_cuda_graph_decode_state` / `plan_cuda_graph`).
Decode steps that carry shared-prefix groups (cascade attention) replay a
second set of graphs (`cascade=True`, device-input mode with the Triton
decode: runtime/attention/triton_cascade_graph.py), each beside the plain
graph of its size and sharing its page table; with other backends, or more
groups than a graph holds, they run eagerly.

Where the backend's graph states need no host plan (`device_planned`: the
Triton decode kernel, the FlashInfer backend's default decode half) and the runner hands
over its device tables, the step's inputs are built inside the graph too:
each graph starts with `step_fill` (runtime/step_fill.py), which reads one
packed buffer of the step's per-request arrays and writes the input ids,
positions, out slots, page table and the new slots in the request-to-slot
table. A step is then one pinned copy and one replay (`run_decode`), not the
~30 small launches of `build_decode_batch` + `run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.runtime.attention.base import (
    AttentionBackend,
    CascadeGraphState,
    DecodeGraphPlanner,
    DecodeGraphState,
)
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.step import StepInput

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what torch.cuda.graph_pool_handle() returns

    from radixserve.runtime.step_fill import StepFillStaging


GRAPH_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# Past the ladder (max_running_requests above 512) graphs come every this many rows, so a batch
# of 513 pads to 640 (25%) rather than to max_bs (a 600-row step of a 1,024 cap would compute
# 1,024 rows).
WIDE_STEP = 128


def graph_batch_sizes(max_bs: int) -> list[int]:
    """The batch sizes captured for a cap of `max_bs` rows: the ladder below it, then every
    `WIDE_STEP` rows, then `max_bs` itself."""
    sizes = [b for b in GRAPH_LADDER if b < max_bs]
    sizes += range(GRAPH_LADDER[-1] + WIDE_STEP, max_bs, WIDE_STEP)
    return [*sizes, max_bs]


def supports_graphs(attn: AttentionBackend) -> bool:
    return attn.decode_graphs() is not None


class DecodeGraphs:
    def __init__(
        self,
        model: nn.Module,
        attn: AttentionBackend,
        max_bs: int,
        max_kv_tokens: int,
        scratch_slot: int,
        device: torch.device,
        tables: tuple[torch.Tensor, torch.Tensor] | None = None,
        cascade: bool = False,
    ) -> None:
        """`tables`: the device request-to-slot table and the runner's last-token buffer;
        with a backend whose graph states are planned on the device, the graphs then
        build their own inputs (`run_decode`). `cascade`: capture cascade decode graphs too
        (where the backend can: `cascade_graphs`), for an engine that forms prefix groups."""
        planner = attn.decode_graphs()
        if planner is None:
            raise TypeError(f"{type(attn).__name__} has no CUDA-graph decode states")
        self.model = model
        self.attn = attn
        self.planner: DecodeGraphPlanner = planner
        self.device = device
        self.scratch = scratch_slot
        self.sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_slots = torch.full((n,), scratch_slot, dtype=torch.int64, device=device)
        self.qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.pad_steps = self.qo_indptr[1:]  # 1, 2, ...: a padding row's one context slot each
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Every graph, plain and cascade, writes its float32 logits into one [max_bs, vocab]
        # buffer (only one replays at a time): a buffer per graph would hold ~2 x the ladder's
        # sum of rows x vocab (3 GiB at 256 rows of a 262k vocabulary) for nothing.
        self.logits_out: torch.Tensor | None = None
        self.logits: dict[int, torch.Tensor] = {}
        self.states: dict[int, DecodeGraphState] = {}
        self.batches: dict[int, ForwardBatch] = {}
        # Cascade decode graphs by batch size (2 and up: a group has 2 rows at least).
        self.cascade_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.cascade_logits: dict[int, torch.Tensor] = {}
        self.cascade_states: dict[int, CascadeGraphState] = {}
        self.max_kv_tokens = max(max_kv_tokens, n)
        self.tables = tables if planner.device_planned else None
        self.staging: StepFillStaging | None = None
        if self.tables is not None:
            from radixserve.runtime.step_fill import StepFillStaging  # imports triton

            self.staging = StepFillStaging(cap=n, device=device)
        self.cascade = cascade and self.tables is not None and planner.cascade_graphs

    @property
    def device_inputs(self) -> bool:
        """Whether decode steps build their inputs inside the graphs (`run_decode`)."""
        return self.tables is not None

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_slots=self.out_slots[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            kv_indptr=self.qo_indptr[: bs + 1],
            kv_indices=torch.full((bs,), self.scratch, dtype=torch.int32, device=self.device),
            extend_lens=[1] * bs,
            prefix_lens=[0] * bs,
        )

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream, pool: _POOL_HANDLE | None = None) -> None:
        """Capture every batch size into `pool` (one is made if None)."""
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        # Weights, KV pool and static buffers were filled on another stream.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        for bs in sorted(self.sizes, reverse=True):  # largest first: it sizes the shared page table
            state = self.planner.make_cuda_graph_decode_state(bs, self.max_kv_tokens)
            batch = self._static_batch(bs)
            self.graphs[bs], self.logits[bs] = self._capture_one(bs, state, batch, stream, pool)
            self.states[bs] = state
            self.batches[bs] = batch
            if self.cascade and bs >= 2:
                cstate = self.planner.make_cuda_graph_cascade_state(state)
                self.cascade_graphs[bs], self.cascade_logits[bs] = self._capture_one(
                    bs, cstate, batch, stream, pool
                )
                self.cascade_states[bs] = cstate
        torch.cuda.synchronize(self.device)

    def _capture_one(
        self,
        bs: int,
        state: DecodeGraphState,
        batch: ForwardBatch,
        stream: torch.cuda.Stream,
        pool: _POOL_HANDLE,
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        self.planner.plan_cuda_graph(state, batch)
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (lazy inits, autotuning, Triton builds) outside the graph
                self._fill(bs, state)
                out = self.model(batch, self.attn)
            if self.logits_out is None:  # the largest batch is captured first
                self.logits_out = torch.empty_like(out)
            del out  # free for the capture to reuse
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            self._fill(bs, state)
            self.logits_out[:bs].copy_(self.model(batch, self.attn))
        return graph, self.logits_out[:bs]

    def _fill(self, bs: int, state: DecodeGraphState) -> None:
        """The graph's first kernel in device-input mode: the step's inputs from the staging
        buffer (before the first upload it holds zero requests: every row is padding)."""
        if self.tables is None or self.staging is None:
            return
        from radixserve.runtime.step_fill import step_fill

        table, last_tokens = self.tables
        step_fill(
            self.staging.device_buf,
            self.max_bs,
            last_tokens,
            table,
            self.input_ids[:bs],
            self.positions[:bs],
            self.out_slots[:bs],
            state.kv_indptr,
            state.kv_indices,
            self.scratch,
        )

    def can_run_decode(self, inp: StepInput) -> bool:
        """A plain decode step that `run_decode` can take (device-input mode only)."""
        b = inp.batch_size
        plain = (
            self.tables is not None
            and inp.is_decode
            and 0 < b <= self.max_bs
            and int(inp.prefix_lens.sum()) + self.max_bs <= self.max_kv_tokens
        )
        if not plain or inp.cascade is None:
            return plain
        state = self.cascade_states.get(self.graph_size(b))
        return state is not None and state.fits(inp.cascade)

    def graph_size(self, b: int) -> int:
        """The captured batch size a step of `b` rows replays (its rows padded up to it)."""
        return next(s for s in self.sizes if s >= b)

    def run_decode(self, inp: StepInput) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits `[B, vocab]` and the rows (device int64) of a decode step: one copy (two for
        a cascade step: its work list), one replay."""
        b = inp.batch_size
        bs = self.graph_size(b)
        assert self.staging is not None, "run_decode without device inputs"
        self.staging.upload(inp)
        if inp.cascade is None:
            self.graphs[bs].replay()
            return self.logits[bs][:b], self.staging.rows[:b]
        self.cascade_states[bs].upload(inp.cascade, inp.prefix_lens)
        self.cascade_graphs[bs].replay()
        return self.cascade_logits[bs][:b], self.staging.rows[:b]

    def can_run(self, fb: ForwardBatch) -> bool:
        # Cascade (shared-prefix) steps run eagerly: their level sizes (groups, prefix
        # lengths) change the kernels' launch shapes, which a fixed graph cannot follow.
        # In device-input mode the graphs read the staging buffer, so only run_decode runs them.
        plain = fb.is_decode and fb.logit_rows is None and fb.cascade is None
        return self.tables is None and plain and fb.batch_size <= self.max_bs

    def run(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits `[B, vocab]` of a decode batch of B requests, through the graph of its size."""
        b = fb.batch_size
        bs = self.graph_size(b)
        self.input_ids[:b].copy_(fb.input_ids)
        self.positions[:b].copy_(fb.positions)
        self.out_slots[:b].copy_(fb.out_slots)
        if bs > b:
            self.input_ids[b:bs].zero_()
            self.positions[b:bs].zero_()
            self.out_slots[b:bs].fill_(self.scratch)
        pad = bs - b
        kv_indices, kv_indptr = fb.kv_indices, fb.kv_indptr
        if pad:
            fill = torch.full((pad,), self.scratch, dtype=kv_indices.dtype, device=self.device)
            kv_indices = torch.cat([kv_indices, fill])
            kv_indptr = torch.cat([kv_indptr, kv_indptr[-1:] + self.pad_steps[:pad]])
        plan_batch = ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_slots=self.out_slots[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            kv_indptr=kv_indptr,  # FlashInfer plans from the host lengths, Triton reads this
            kv_indices=kv_indices,
            extend_lens=[1] * bs,
            prefix_lens=[*fb.prefix_lens, *([0] * pad)],
        )
        self.planner.plan_cuda_graph(self.states[bs], plan_batch)
        self.graphs[bs].replay()
        return self.logits[bs][:b]
