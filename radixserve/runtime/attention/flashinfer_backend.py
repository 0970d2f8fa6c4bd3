"""Attention through FlashInfer's paged kernels (page size 1, NHD layout).

The pool's per-layer `[num_slots, Hkv, D]` buffers are FlashInfer's paged
cache with one token per page (`view(-1, 1, Hkv, D)`), and `kv_indptr` /
`kv_indices` are its page table as they stand, so nothing is converted.

- Extend steps (any request with several new tokens, mixed with decodes or
  not) use `BatchPrefillWithPagedKVCacheWrapper` with the causal mask, which
  aligns each request's queries to the end of its context (the prefix offset).
- Pure-decode steps run our Triton split-K decode kernel by default
  (`decode_kernel="auto"` with triton installed; runtime/attention/
  triton_decode.py says why: 1.1-1.5x faster on the H200, no host plan).
  `decode_kernel="flashinfer"` uses `BatchDecodeWithPagedKVCacheWrapper`, on
  tensor cores when a KV head serves at least 4 query heads (the group fills
  an MMA tile; below that the CUDA-core kernel wins; it reuses the prefill
  module, so one JIT build serves both).
- `plan(batch)` plans one wrapper per step, shared by all layers; its host
  inputs (indptrs, page lengths) are built from the batch's host lists, so
  planning never reads the device.
- One float workspace is shared by every wrapper: they run one after the other
  on one stream.
- Shared-prefix (cascade) decode steps (`batch.cascade`, runtime/cascade.py)
  with the Triton decode run triton_cascade.py's kernels, eagerly
  (`TritonCascadePlan`) or replayed from graphs (`make_cuda_graph_cascade_state`).
  With FlashInfer's decode they run eagerly: level 1 is the decode wrapper over
  each row's context after its group's prefix (`return_lse=True`), level 0 a
  non-causal prefill wrapper whose "requests" are the groups (each prefix read
  once), and `merge_state_in_place` folds level 0 into level 1's rows: the
  two-level case of `MultiLevelCascadeAttentionWrapper`, composed by hand so
  that rows in no group skip level 0 and level 1 keeps the tensor-core decode.

CUDA graphs for decode (the runner's side):

    state = backend.make_cuda_graph_decode_state(bs, max_kv_tokens)
    backend.plan_cuda_graph(state, warmup_batch)      # outside the graph
    with torch.cuda.graph(g): logits = model(static_batch)   # forward() runs state's wrapper
    each step: fill the static inputs, backend.plan_cuda_graph(state, batch); g.replay()

Plan always happens outside the graph (it copies the page table into the
state's fixed buffers and writes the kernel schedule); the captured kernels
read those buffers. A padded batch must give every padding row a context of
at least one token and an out slot that no live request reads (a scratch
slot), since the graph writes K/V for all `bs` rows.

Written against the `plan` / `run` API shared by flashinfer 0.3.x and 0.7.x
(keyword arguments after `page_size`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention.base import AttentionBackend, DecodeGraphState
from radixserve.runtime.attention.flashinfer_plan_max import speed_up_plans
from radixserve.runtime.attention.flashinfer_plans import (
    FlashInferDecodeGraphState,
    PlanSlot,
    host_indptr,
    import_flashinfer,
    pinned_ones,
)
from radixserve.runtime.attention.kv_store_select import pool_writer
from radixserve.runtime.attention.triton_decode import TritonDecode, TritonDecodeGraphState
from radixserve.runtime.cascade import CascadeGroups, cascade_indices
from radixserve.runtime.forward_batch import ForwardBatch

if TYPE_CHECKING:  # they import triton
    from radixserve.runtime.attention.triton_cascade import CascadeShape
    from radixserve.runtime.attention.triton_cascade_graph import CascadeGraphs, TritonCascadeGraphState

WORKSPACE_BYTES = 128 << 20
TENSOR_CORE_MIN_GROUP = 4
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


class LayerRun(Protocol):
    """What a step runs in every layer once planned: a FlashInfer wrapper, our Triton decode,
    a Triton graph state or cascade plan."""

    def run(self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor: ...


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"
    supports_cascade = True

    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        decode_tensor_cores: bool | None = None,
        prefill_backend: str = "fa2",
        workspace_bytes: int = WORKSPACE_BYTES,
        decode_kernel: str = "auto",
    ) -> None:
        """`decode_kernel`: "triton" (our split-K kernel), "flashinfer" (its decode
        wrapper), "auto" (Triton when it is installed).
        `decode_tensor_cores` (FlashInfer's decode): None picks by GQA group size (>= 4).
        `prefill_backend`: FlashInfer's name; "fa2" shares its compiled module
        with the tensor-core decode path (one JIT build per dtype and head
        size), "auto" lets FlashInfer pick FA3 on Hopper."""
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale)
        fi = import_flashinfer()
        device = torch.device(pool.config.device)
        if device.type != "cuda":
            raise RuntimeError(f"the flashinfer attention backend needs a CUDA KV pool, got device {device}")
        if pool.config.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"the flashinfer attention backend supports float16/bfloat16 KV, got {pool.config.dtype}"
            )
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self._fi = fi
        speed_up_plans(fi)
        self.device = device
        self.dtype = pool.config.dtype
        group = num_heads // num_kv_heads
        self.decode_tensor_cores = (
            group >= TENSOR_CORE_MIN_GROUP if decode_tensor_cores is None else decode_tensor_cores
        )
        self.prefill_backend = prefill_backend
        if decode_kernel not in ("auto", "triton", "flashinfer"):
            raise ValueError(f"decode_kernel={decode_kernel!r}: use auto, triton or flashinfer")
        if decode_kernel == "auto":
            decode_kernel = "triton" if importlib.util.find_spec("triton") is not None else "flashinfer"
        self.decode_kernel = decode_kernel
        # Plain decode steps.
        self._triton_decode = TritonDecode(num_kv_heads, scale, device) if decode_kernel == "triton" else None
        self.device_planned_graphs = self._triton_decode is not None
        self.graph_extend = importlib.util.find_spec("triton") is not None
        if self.graph_extend:
            from radixserve.runtime.attention.triton_extend import graph_attention  # imports triton

            self._graph_attention = graph_attention
        # Cascade steps with the Triton decode: its own two levels (triton_cascade.py); else FlashInfer's.
        self._cascade_shape: CascadeShape | None = None
        self._cascade_graphs: CascadeGraphs | None = None  # with the Triton decode
        if self._triton_decode is not None:
            from radixserve.runtime.attention import triton_cascade, triton_cascade_graph  # import triton

            self._cascade_shape = triton_cascade.CascadeShape(
                num_kv_heads, group, scale, 128, self._triton_decode.num_sms
            )
            self._cascade_build = triton_cascade.TritonCascadePlan.build
            self._cascade_graphs = triton_cascade_graph.CascadeGraphs(self._cascade_shape, device)
        self._store_kv = pool_writer(pool)
        # Zeroed once: FlashInfer requires a zeroed float workspace on first use.
        self._workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=device)
        # Two wrappers of each kind, alternated per step (see PlanGuard); level 0 of cascade
        # steps (the groups' queries against their shared prefixes) is a prefill wrapper.
        ws = self._workspace

        def pair(make: Callable[..., object], **kw: object) -> list[PlanSlot]:
            return [PlanSlot(make(ws, "NHD", **kw)) for _ in range(2)]

        self._prefill = pair(fi.BatchPrefillWithPagedKVCacheWrapper, backend=prefill_backend)
        self._shared = pair(fi.BatchPrefillWithPagedKVCacheWrapper, backend=prefill_backend)
        self._decode = pair(fi.BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=self.decode_tensor_cores)
        self._turn = {"prefill": 0, "decode": 0, "shared": 0}
        self._active: LayerRun | None = None
        self._cascade_slots: tuple[PlanSlot, PlanSlot] | None = None  # FlashInfer's levels 1 and 0
        self._grouped_rows: torch.Tensor | None = None  # level 0's rows; None: all, in order
        self._graph_indices: torch.Tensor | None = None
        # Page-size-1 views of each layer's buffers, made once.
        self._caches = [
            (k.view(-1, 1, num_kv_heads, head_dim), v.view(-1, 1, num_kv_heads, head_dim))
            for k, v in zip(pool.k, pool.v, strict=True)
        ]

    def _next(self, kind: str) -> PlanSlot:
        slots = {"prefill": self._prefill, "decode": self._decode, "shared": self._shared}[kind]
        i = self._turn[kind]
        self._turn[kind] = i ^ 1
        return slots[i]

    def _plan_decode(self, slot: PlanSlot, batch: ForwardBatch) -> None:
        self._plan_paged_decode(slot, batch.seq_lens, batch.kv_indices)

    def _plan_paged_decode(self, slot: PlanSlot, lens: list[int], indices: torch.Tensor) -> None:
        slot.guard.before_plan()
        slot.wrapper.plan(
            host_indptr(lens),
            indices,
            pinned_ones(len(lens)),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            pos_encoding_mode="NONE",
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            sm_scale=self.scale,
            non_blocking=True,
        )
        slot.guard.after_plan()
        self._active = slot.wrapper

    def plan(self, batch: ForwardBatch) -> None:
        self._cascade_slots = None
        if batch.is_decode and batch.cascade is not None and self._cascade_shape is not None:
            self._active = self._cascade_build(batch, batch.cascade, self._cascade_shape)
            return
        if batch.is_decode and batch.cascade is not None:
            self._plan_cascade(batch, batch.cascade)
            return
        if batch.is_decode and self._triton_decode is not None:
            self._triton_decode.plan(batch)
            self._active = self._triton_decode
            return
        if batch.is_decode:
            self._plan_decode(self._next("decode"), batch)
            return
        slot = self._next("prefill")
        self._plan_prefill(slot, batch.extend_lens, batch.seq_lens, batch.kv_indices, causal=True)
        self._active = slot.wrapper

    def _plan_prefill(
        self, slot: PlanSlot, qo_lens: list[int], kv_lens: list[int], indices: torch.Tensor, causal: bool
    ) -> None:
        """Plan a prefill wrapper: request i has qo_lens[i] queries over kv_lens[i] slots."""
        slot.guard.before_plan()
        slot.wrapper.plan(
            host_indptr(qo_lens),
            host_indptr(kv_lens),
            indices,
            pinned_ones(len(kv_lens)),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            causal=causal,
            pos_encoding_mode="NONE",
            sm_scale=self.scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            non_blocking=True,
        )
        slot.guard.after_plan()

    def prepare_cascade(self) -> None:
        """Build (or load) FlashInfer's merge kernel now, at start-up, rather than in the
        first cascade step (a JIT build takes tens of seconds); the Triton cascade needs none."""
        if self._cascade_shape is not None:
            return
        v = torch.zeros(1, self.num_heads, self.head_dim, dtype=self.dtype, device=self.device)
        s = torch.zeros(1, self.num_heads, dtype=torch.float32, device=self.device)
        self._fi.merge_state_in_place(v, s, v.clone(), s.clone())

    def _plan_cascade(self, batch: ForwardBatch, groups: CascadeGroups) -> None:
        """Level 1 (every row's unique suffix) on a decode wrapper, level 0 (each
        group's shared prefix, once) on a non-causal prefill wrapper."""
        idx = cascade_indices(batch.kv_indices, batch.seq_lens, groups)
        level1 = self._next("decode")
        self._plan_paged_decode(level1, idx.suffix_lens, idx.suffix_indices)
        level0 = self._next("shared")
        self._plan_prefill(level0, idx.group_sizes, idx.prefix_lens, idx.prefix_indices, causal=False)
        self._cascade_slots = (level1, level0)
        self._grouped_rows = idx.grouped_rows

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        if self._active is None and batch.graph is None:
            raise RuntimeError("FlashInferAttention.forward before plan()")
        self._store_kv(self.pool, layer, batch.out_slots, k, v)
        # Rows may be strided (q is a view of the fused qkv output): the kernels take a row
        # and a head stride, so only the element must be dense.
        qc = q.to(self.dtype)
        if qc.stride(-1) != 1:
            qc = qc.contiguous()
        if batch.graph is not None:  # replayed from a graph (runtime/extend_graphs.py): no plan
            out = self._graph_attention(qc, (self.pool.k[layer], self.pool.v[layer]), batch, self.scale)
        elif self._cascade_slots is not None:
            out = self._cascade_run(qc, self._caches[layer], *self._cascade_slots)
        else:
            assert self._active is not None
            out = self._active.run(qc, self._caches[layer])
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def _cascade_run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], level1: PlanSlot, level0: PlanSlot
    ) -> torch.Tensor:
        out, lse = level1.wrapper.run(q, cache, return_lse=True)  # [B, Hq, D], [B, Hq]
        rows = self._grouped_rows
        o0, lse0 = level0.wrapper.run(q if rows is None else q[rows], cache, return_lse=True)
        if rows is None:  # every row is grouped, groups in row order: merge in place
            self._fi.merge_state_in_place(out, lse, o0, lse0)
            return out
        o1, lse1 = out[rows], lse[rows]
        self._fi.merge_state_in_place(o1, lse1, o0, lse0)
        return out.index_copy_(0, rows, o1)

    # --- CUDA graphs (decode) -------------------------------------------------

    def make_cuda_graph_decode_state(
        self, batch_size: int, max_kv_tokens: int
    ) -> FlashInferDecodeGraphState | TritonDecodeGraphState:
        """A graph-capturable decode wrapper for exactly `batch_size` rows whose
        contexts add up to at most `max_kv_tokens` slots.

        Create one per captured batch size, largest first: the page-table
        buffer is shared by all states (only one graph replays at a time, and
        each replay's plan refills it first), so the first call sizes it.
        """
        if batch_size <= 0 or max_kv_tokens < batch_size:
            raise ValueError(
                f"need batch_size >= 1 and max_kv_tokens >= batch_size, got {batch_size}, {max_kv_tokens}"
            )
        if self._triton_decode is not None:
            return self._triton_decode.make_graph_state(batch_size, max_kv_tokens)
        if self._graph_indices is None or self._graph_indices.numel() < max_kv_tokens:
            indices = torch.zeros(max_kv_tokens, dtype=torch.int32, device=self.device)
            if self._graph_indices is None:
                self._graph_indices = indices
        else:
            indices = self._graph_indices
        indptr = torch.zeros(batch_size + 1, dtype=torch.int32, device=self.device)
        last = torch.ones(batch_size, dtype=torch.int32, device=self.device)
        wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.decode_tensor_cores,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last,
        )
        return FlashInferDecodeGraphState(batch_size, max_kv_tokens, PlanSlot(wrapper), indptr, indices, last)

    def plan_cuda_graph(self, state: DecodeGraphState, batch: ForwardBatch) -> None:
        """Plan `state` (from `make_cuda_graph_decode_state` or `..._cascade_state`) for `batch`
        (padded to `state.batch_size` decode rows), outside any graph; the next captured
        forward or replay uses it."""
        if batch.batch_size != state.batch_size or not batch.is_decode:
            raise ValueError(
                f"graph state for {state.batch_size} decode rows got a batch of {batch.batch_size} "
                f"(decode={batch.is_decode})"
            )
        if batch.kv_indices.numel() > state.max_kv_tokens:
            raise ValueError(
                f"batch has {batch.kv_indices.numel()} context slots, state holds {state.max_kv_tokens}"
            )
        self._cascade_slots = None
        if isinstance(state, FlashInferDecodeGraphState):
            self._plan_decode(state.slot, batch)
            return
        if isinstance(state, TritonDecodeGraphState):
            TritonDecode.plan_graph(state, batch)
        # A Triton state, plain or cascade (whose work list is written before replay): it runs.
        self._active = cast(LayerRun, state)

    @property
    def cascade_graphs(self) -> bool:
        """Whether cascade decode steps can be captured: with the Triton decode."""
        return self._cascade_graphs is not None

    def make_cuda_graph_cascade_state(self, plain: DecodeGraphState) -> TritonCascadeGraphState:
        """A cascade graph state beside the plain one of the same size; largest first."""
        assert self._cascade_graphs is not None and isinstance(plain, TritonDecodeGraphState)
        return self._cascade_graphs.make(plain)
