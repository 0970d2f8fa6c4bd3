"""`HybridAttention`: one backend for extend steps and another for decode steps, over one pool.

A step goes to one half: a decode step (one new token per request, `batch.is_decode`; cascade
steps too) to `decode`, any other step to `extend`, and so does its plan. Decode graphs are the
decode half's (`decode_graphs`), extend graphs the extend half's (`graph_extend`). The hybrid
writes the step's K/V (`AttentionBackend.forward`; on CUDA the same fused writer as either half),
then a layer's attention is one call to one half.
"""

from __future__ import annotations

import torch

from radixserve.runtime.attention.base import AttentionBackend, DecodeGraphPlanner
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild


class HybridAttention(AttentionBackend):
    def __init__(self, name: str, extend: AttentionBackend, decode: AttentionBackend) -> None:
        if extend.pool is not decode.pool:
            raise ValueError("the halves of a hybrid attention backend must share one KV pool")
        super().__init__(extend.pool, extend.num_heads, extend.num_kv_heads, extend.head_dim, extend.scale)
        self.name = name
        self.extend = extend
        self.decode = decode

    @property
    def supports_cascade(self) -> bool:
        return self.decode.supports_cascade  # cascade steps are decode steps

    @property
    def supports_windows(self) -> bool:
        return self.extend.supports_windows and self.decode.supports_windows

    @property
    def supports_logit_softcap(self) -> bool:
        return self.extend.supports_logit_softcap and self.decode.supports_logit_softcap

    @property
    def graph_extend(self) -> bool:
        return self.extend.graph_extend

    def decode_graphs(self) -> DecodeGraphPlanner | None:
        return self.decode.decode_graphs()

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """Each half's builds for the steps it runs."""
        extend = [b for b in self.extend.kernel_builds(cascade) if b.step in ("extend", "any")]
        return extend + [b for b in self.decode.kernel_builds(cascade) if b.step != "extend"]

    def _half(self, batch: ForwardBatch) -> AttentionBackend:
        return self.decode if batch.is_decode and batch.graph is None else self.extend

    def plan(self, batch: ForwardBatch) -> None:
        self._half(batch).plan(batch)

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return self._half(batch).attend(q, layer, batch)
