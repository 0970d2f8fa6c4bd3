"""`TritonDecodeAttention`: decode steps on our Triton split-K kernel (triton_decode.py says
why: 1.1-1.5x faster than FlashInfer's decode on the H200, and no host plan), as the decode
half of a `HybridAttention` beside FlashInfer's extend.

Shared-prefix (cascade) steps run triton_cascade.py's two levels, eagerly
(`TritonCascadePlan`) or replayed from their own graphs (`make_cuda_graph_cascade_state`).
Graph states read only device buffers (`device_planned`): decode graphs build their inputs
inside the graph (runtime/cuda_graph.py, `run_decode`).

Windows and the logit soft-cap (`AttentionOptions`) go to the split-K kernel per layer, in eager
steps and graphs alike; cascade steps are for models without either (`supports_cascade`, as in
triton_backend.py), and a batch that carries groups anyway runs as plain decode.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention.base import (
    AttentionBackend,
    AttentionOptions,
    CascadeGraphState,
    DecodeGraphPlanner,
    DecodeGraphState,
    LayerOptions,
)
from radixserve.runtime.attention.graph_checks import check_graph_batch, load_page_table
from radixserve.runtime.attention.triton_decode import TritonDecode, TritonDecodeGraphState
from radixserve.runtime.attention.warm_batches import per_layer_option
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild

# The cascade's block size over prefix slots (triton_cascade.py).
CASCADE_BLOCK_N = 128


class LayerRun(Protocol):
    """What a planned step runs in every layer: the Triton decode, a cascade plan, a graph state."""

    def run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], opts: LayerOptions
    ) -> torch.Tensor: ...


class TritonDecodeAttention(AttentionBackend):
    name = "triton-decode"
    triton_kernels = True

    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        options: AttentionOptions | None = None,
    ) -> None:
        """`options`: the model's windows and soft-cap."""
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale, options)
        from radixserve.runtime.attention import triton_cascade, triton_cascade_graph  # import triton

        self.dtype = pool.config.attn_dtype  # q's: an FP8 pool's tiles are upcast to it
        device = torch.device(pool.config.device)
        self._decode = TritonDecode(num_kv_heads, scale, device)
        group = num_heads // num_kv_heads
        self._cascade_shape = triton_cascade.CascadeShape(
            num_kv_heads, group, scale, CASCADE_BLOCK_N, self._decode.num_sms
        )
        self._cascade_build = triton_cascade.TritonCascadePlan.build
        self._cascade_graphs = triton_cascade_graph.CascadeGraphs(self._cascade_shape, device)
        self._active: LayerRun | None = None
        # The kernels read the pool as FlashInfer's page-size-1 views (one layout for both halves).
        self._caches = [
            (k.view(-1, 1, num_kv_heads, head_dim), v.view(-1, 1, num_kv_heads, head_dim))
            for k, v in zip(pool.k, pool.v, strict=True)
        ]

    @property
    def supports_cascade(self) -> bool:
        return self.options.plain  # see the module docstring

    @property
    def supports_windows(self) -> bool:
        return True

    @property
    def supports_logit_softcap(self) -> bool:
        return True

    @property
    def device_planned(self) -> bool:
        return True

    @property
    def cascade_graphs(self) -> bool:
        return self.supports_cascade

    def decode_graphs(self) -> DecodeGraphPlanner:
        return self

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """Eager decode (and cascade) steps per layer variant; the graphs' warm-up builds the
        captured ones (runtime/cuda_graph.py)."""
        builds = per_layer_option(self, "triton decode", "decode")
        if cascade and self.supports_cascade:
            builds += per_layer_option(self, "triton cascade", "cascade")
        return builds

    def plan(self, batch: ForwardBatch) -> None:
        if batch.cascade is not None and self.supports_cascade:
            self._active = self._cascade_build(batch, batch.cascade, self._cascade_shape)
            return
        self._decode.plan(batch)
        self._active = self._decode

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if self._active is None:
            raise RuntimeError("TritonDecodeAttention.forward before plan()")
        qc = q.to(self.dtype)
        if qc.stride(-1) != 1:  # rows may be strided (a view of the fused qkv): elements must be dense
            qc = qc.contiguous()
        out = self._active.run(qc, self._caches[layer], self.layer_options[layer])
        return out if out.dtype == q.dtype else out.to(q.dtype)

    # --- CUDA graphs ------------------------------------------------------------------------

    def make_cuda_graph_decode_state(self, batch_size: int, max_kv_tokens: int) -> TritonDecodeGraphState:
        """Largest batch size first: the first call sizes the shared `kv_indices` buffer."""
        return self._decode.make_graph_state(batch_size, max_kv_tokens)

    def plan_cuda_graph(self, state: DecodeGraphState, batch: ForwardBatch) -> None:
        """A plain state takes the padded batch's device page table; a cascade state's work list
        is uploaded before each replay. Either then runs in every layer."""
        check_graph_batch(state, batch)
        if isinstance(state, TritonDecodeGraphState):
            load_page_table(state, batch)
        # A Triton state, plain or cascade: it runs (the cascade one's type imports triton).
        self._active = cast(LayerRun, state)

    def make_cuda_graph_cascade_state(self, plain: DecodeGraphState) -> CascadeGraphState:
        """A cascade graph state beside the plain one of the same size; largest first."""
        assert isinstance(plain, TritonDecodeGraphState)
        return self._cascade_graphs.make(plain)
