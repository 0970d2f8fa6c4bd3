"""`FlashInferDecode`: plain decode steps through FlashInfer's
`BatchDecodeWithPagedKVCacheWrapper`, its CUDA-graph states, and shared-prefix steps eagerly.

Tensor cores when a KV head serves at least 4 query heads (the group fills an MMA tile; below
that the CUDA-core kernel wins; it reuses the prefill module, so one JIT build serves both).

Shared-prefix (cascade) steps (`batch.cascade`, runtime/cascade.py): level 1 is the decode
wrapper over each row's context after its group's prefix (`return_lse=True`), level 0 a
non-causal prefill wrapper whose "requests" are the groups (each prefix read once), and
`merge_state_in_place` folds level 0 into level 1's rows: the two-level case of
`MultiLevelCascadeAttentionWrapper`, composed by hand so that rows in no group skip level 0
and level 1 keeps the tensor-core decode. They run eagerly (no cascade graphs).

CUDA graphs (the runner's side):

    state = backend.make_cuda_graph_decode_state(bs, max_kv_tokens)
    backend.plan_cuda_graph(state, warmup_batch)      # outside the graph
    with torch.cuda.graph(g): logits = model(static_batch)   # forward() runs state's wrapper
    each step: fill the static inputs, backend.plan_cuda_graph(state, batch); g.replay()

Plan always happens outside the graph (it copies the page table into the state's fixed
buffers and writes the kernel schedule); the captured kernels read those buffers. A padded
batch must give every padding row a context of at least one token and an out slot that no
live request reads (a scratch slot), since the graph writes K/V for all `bs` rows.
"""

from __future__ import annotations

from functools import partial

import torch

from radixserve.runtime.attention.base import (
    AttentionBackend,
    CascadeGraphState,
    DecodeGraphPlanner,
    DecodeGraphState,
)
from radixserve.runtime.attention.flashinfer_plans import (
    FlashInferDecodeGraphState,
    FlashInferPlanner,
    PlanSlot,
)
from radixserve.runtime.attention.graph_checks import SharedPageTable, check_graph_batch
from radixserve.runtime.attention.warm_batches import run_step, shape_label
from radixserve.runtime.cascade import cascade_indices
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild


class FlashInferDecode(AttentionBackend):
    name = "flashinfer-decode"

    def __init__(self, planner: FlashInferPlanner, tensor_cores: bool, prefill_backend: str) -> None:
        p = planner
        super().__init__(p.pool, p.num_heads, p.num_kv_heads, p.head_dim, p.scale)
        self.planner = planner
        self.tensor_cores = tensor_cores
        self._decode = p.pair(p.fi.BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=tensor_cores)
        # Level 0 of cascade steps (the groups' queries against their shared prefixes).
        self._shared = p.pair(p.fi.BatchPrefillWithPagedKVCacheWrapper, backend=prefill_backend)
        self._turn = {"decode": 0, "shared": 0}
        self._active: PlanSlot | None = None
        self._level0: PlanSlot | None = None  # set for a cascade step
        self._grouped_rows: torch.Tensor | None = None  # level 0's rows; None: all, in order
        self._page_table = SharedPageTable(p.device)

    @property
    def supports_cascade(self) -> bool:
        return True

    @property
    def device_planned(self) -> bool:
        return False  # FlashInfer's plan runs on the host

    @property
    def cascade_graphs(self) -> bool:
        return False

    def decode_graphs(self) -> DecodeGraphPlanner:
        return self

    def _next(self, kind: str) -> PlanSlot:
        slots = self._decode if kind == "decode" else self._shared
        i = self._turn[kind]
        self._turn[kind] = i ^ 1
        return slots[i]

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """The decode module (with tensor cores: the prefill module, shared with the extend
        half), and for cascade steps level 0's prefill wrapper and the merge kernel."""
        kind = "batch_decode (tensor cores: the prefill module)" if self.tensor_cores else "batch_decode"
        builds = [
            KernelBuild(
                f"flashinfer {kind} {shape_label(self)}", partial(run_step, self, "decode", 0), "decode"
            )
        ]
        if cascade:
            label = f"flashinfer cascade (level-0 prefill, merge_state) {shape_label(self)}"
            builds.append(KernelBuild(label, partial(run_step, self, "cascade", 0), "cascade"))
        return builds

    def plan(self, batch: ForwardBatch) -> None:
        self._level0 = None
        slot = self._next("decode")
        if batch.cascade is None:
            self.planner.plan_decode(slot, batch.seq_lens, batch.kv_indices)
            self._active = slot
            return
        # Level 1 (every row's unique suffix) on a decode wrapper, level 0 (each group's shared
        # prefix, once) on a non-causal prefill wrapper.
        idx = cascade_indices(batch.kv_indices, batch.seq_lens, batch.cascade)
        self.planner.plan_decode(slot, idx.suffix_lens, idx.suffix_indices)
        level0 = self._next("shared")
        self.planner.plan_prefill(level0, idx.group_sizes, idx.prefix_lens, idx.prefix_indices, causal=False)
        self._active, self._level0, self._grouped_rows = slot, level0, idx.grouped_rows

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if self._active is None:
            raise RuntimeError("FlashInferDecode.forward before plan()")
        qc = self.planner.query(q)
        cache = self.planner.caches[layer]
        scales = self.planner.run_scales[layer]
        if self._level0 is not None:
            out = self._cascade_run(qc, cache, self._active, self._level0, scales)
        else:
            out = self._active.wrapper.run(qc, cache, **scales)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def _cascade_run(
        self,
        q: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        level1: PlanSlot,
        level0: PlanSlot,
        scales: dict[str, float],
    ) -> torch.Tensor:
        """`scales`: an FP8 pool's (K's is in both levels' log-sum-exp, V's in both outputs)."""
        merge = self.planner.fi.merge_state_in_place
        out, lse = level1.wrapper.run(q, cache, return_lse=True, **scales)  # [B, Hq, D], [B, Hq]
        rows = self._grouped_rows
        o0, lse0 = level0.wrapper.run(q if rows is None else q[rows], cache, return_lse=True, **scales)
        if rows is None:  # every row is grouped, groups in row order: merge in place
            merge(out, lse, o0, lse0)
            return out
        o1, lse1 = out[rows], lse[rows]
        merge(o1, lse1, o0, lse0)
        return out.index_copy_(0, rows, o1)

    # --- CUDA graphs ------------------------------------------------------------------------

    def make_cuda_graph_decode_state(self, batch_size: int, max_kv_tokens: int) -> FlashInferDecodeGraphState:
        """A graph-capturable decode wrapper for exactly `batch_size` rows whose contexts add up
        to at most `max_kv_tokens` slots. Create one per captured batch size, largest first: the
        page-table buffer is shared by all states (only one graph replays at a time, and each
        replay's plan refills it first), so the first call sizes it."""
        device = self.planner.device
        indices = self._page_table.take(batch_size, max_kv_tokens)
        indptr = torch.zeros(batch_size + 1, dtype=torch.int32, device=device)
        last = torch.ones(batch_size, dtype=torch.int32, device=device)
        wrapper = self.planner.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.planner.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.tensor_cores,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last,
        )
        return FlashInferDecodeGraphState(batch_size, max_kv_tokens, PlanSlot(wrapper), indptr, indices, last)

    def plan_cuda_graph(self, state: DecodeGraphState, batch: ForwardBatch) -> None:
        """Plan `state` for `batch` (padded to `state.batch_size` decode rows), outside any
        graph; the next captured forward or replay uses it."""
        check_graph_batch(state, batch)
        assert isinstance(state, FlashInferDecodeGraphState)
        self._level0 = None
        self.planner.plan_decode(state.slot, batch.seq_lens, batch.kv_indices)
        self._active = state.slot

    def make_cuda_graph_cascade_state(self, plain: DecodeGraphState) -> CascadeGraphState:
        raise NotImplementedError("FlashInfer's decode runs cascade steps eagerly (cascade_graphs is False)")
