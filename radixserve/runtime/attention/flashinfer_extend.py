"""`FlashInferExtend`: extend steps (prefill chunks, decode rows beside them, forced tokens)
through FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` with the causal mask, which aligns
each request's queries to the end of its context (the prefix offset).

`plan(batch)` plans one wrapper per step, shared by all layers, from the batch's host lists
(planning never reads the device). Extend steps replayed from CUDA graphs
(runtime/extend_graphs.py, `batch.graph`) run our Triton kernels instead, which need no plan:
that path exists where triton is installed (`graph_extend`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import partial

import torch

from radixserve.runtime.attention.base import AttentionBackend, LayerOptions
from radixserve.runtime.attention.flashinfer_plans import FlashInferPlanner, PlanSlot
from radixserve.runtime.attention.warm_batches import run_step, shape_label
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild

GraphAttention = Callable[
    [torch.Tensor, tuple[torch.Tensor, torch.Tensor], ForwardBatch, float, LayerOptions], torch.Tensor
]


class FlashInferExtend(AttentionBackend):
    name = "flashinfer-extend"

    def __init__(self, planner: FlashInferPlanner, prefill_backend: str) -> None:
        """`prefill_backend`: FlashInfer's name; "fa2" shares its compiled module with the
        tensor-core decode path (one JIT build per dtype and head size), "auto" lets
        FlashInfer pick FA3 on Hopper."""
        p = planner
        super().__init__(p.pool, p.num_heads, p.num_kv_heads, p.head_dim, p.scale)
        self.planner = planner
        self._slots = planner.pair(planner.fi.BatchPrefillWithPagedKVCacheWrapper, backend=prefill_backend)
        self._prefill_backend = prefill_backend
        self._turn = 0
        self._active: PlanSlot | None = None
        self._graph_attention: GraphAttention | None = None
        if importlib.util.find_spec("triton") is not None:
            from radixserve.runtime.attention.triton_extend import graph_attention  # imports triton

            self._graph_attention = graph_attention

    @property
    def graph_extend(self) -> bool:
        return self._graph_attention is not None

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """FlashInfer's paged prefill module (its wrapper's plan builds it). Graph-replayed extend
        steps run Triton's kernel, which the extend graphs' own warm-up builds."""
        label = f"flashinfer batch_prefill ({self._prefill_backend}) {shape_label(self)}"
        return [KernelBuild(label, partial(run_step, self, "extend", 0), "extend")]

    def plan(self, batch: ForwardBatch) -> None:
        slot = self._slots[self._turn]
        self._turn ^= 1
        self.planner.plan_prefill(slot, batch.extend_lens, batch.seq_lens, batch.kv_indices, causal=True)
        self._active = slot

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        qc = self.planner.query(q)
        if batch.graph is not None:  # replayed from a graph (runtime/extend_graphs.py): no plan
            assert self._graph_attention is not None
            kv = (self.pool.k[layer], self.pool.v[layer])
            out = self._graph_attention(qc, kv, batch, self.scale, self.layer_options[layer])
        else:
            if self._active is None:
                raise RuntimeError("FlashInferExtend.forward before plan()")
            out = self._active.wrapper.run(qc, self.planner.caches[layer], **self.planner.run_scales[layer])
        return out if out.dtype == q.dtype else out.to(q.dtype)
