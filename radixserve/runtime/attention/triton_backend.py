"""Attention with our own Triton kernels over the token-level slot table.

For GPUs where FlashInfer is missing, and for debugging: the kernels read
the same `kv_indptr` / `kv_indices` the scheduler builds, so no layout
conversion happens. A pure-decode step runs the split-K decode kernel;
any step with a multi-token request runs the extend kernel for all rows.
On the CPU the kernels run under `TRITON_INTERPRET=1` (tests only).
Shared-prefix (cascade) decode steps read each group's prefix once
(runtime/attention/triton_cascade.py).

Sliding windows and the logit soft-cap (`AttentionOptions`) are computed by
every kernel here but the cascade's: a windowed or soft-capped model takes no
cascade steps (`supports_cascade` is False; the engine then forms no groups,
and a batch that carries some anyway runs as plain decode). Cascade's level 0
reads a shared prefix once for all rows, which a window (it differs per row,
counted back from each row's end) would have to cut per row: not worth it for
the models that have one.

Decode is capturable in a CUDA graph when `decode_splits` is fixed (the grid
then depends on the batch size alone): the kernels read each request's range
from `kv_indptr` on the device, so a runner that keeps `kv_indptr`,
`kv_indices` (sized for the longest batch) and `out_slots` in static buffers
can replay one graph per batch size.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention import triton_extend as te
from radixserve.runtime.attention import triton_kernels as tk
from radixserve.runtime.attention.base import AttentionBackend, AttentionOptions
from radixserve.runtime.attention.triton_cascade import CascadeShape, TritonCascadePlan
from radixserve.runtime.attention.triton_decode import decode_tiling
from radixserve.runtime.attention.warm_batches import per_layer_option
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild


class TritonAttention(AttentionBackend):
    name = "triton"
    triton_kernels = True

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
    def graph_extend(self) -> bool:
        return True

    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        decode_splits: int | None = None,
        options: AttentionOptions | None = None,
    ) -> None:
        """`decode_splits` fixes the split-K factor (e.g. for CUDA graphs,
        whose grid must not change); None picks it per step from the batch.
        `options`: the model's windows and soft-cap."""
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale, options)
        self.decode_splits = decode_splits
        device = torch.device(pool.config.device)
        on_gpu = device.type == "cuda"
        self._num_sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 1
        # The interpreter's cost is per program step, so small tiles there;
        # on the GPU, tiles sized for the shared memory of the element type.
        wide = pool.config.attn_dtype == torch.float32
        self._block_m = 64 if on_gpu else 16
        self._block_n = (32 if wide else 64) if on_gpu else 16
        self._decode_block_n = 64 if on_gpu else 16
        self._max_extend = 1
        self._tiling = tk.DecodeTiling()
        self._is_decode = True
        self._cascade: TritonCascadePlan | None = None
        group = num_heads // num_kv_heads
        self._cascade_shape = CascadeShape(num_kv_heads, group, scale, self._decode_block_n, self._num_sms)

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """The extend and the split-K decode kernel per layer variant, the cascade's two levels
        where the engine forms groups. The graph-replayed extend kernel is built by the extend
        graphs' own warm-up (runtime/extend_graphs.py)."""
        builds = per_layer_option(self, "triton extend", "extend")
        builds += per_layer_option(self, "triton decode", "decode")
        if cascade and self.supports_cascade:
            builds += per_layer_option(self, "triton cascade", "cascade")
        return builds

    def _pick_tiling(self, batch: ForwardBatch) -> tk.DecodeTiling:
        """The engine's split rule (`triton_decode.decode_tiling`), with this backend's key tile."""
        if self.decode_splits is not None:
            return tk.DecodeTiling(self.decode_splits, self._decode_block_n)
        tiling = decode_tiling(batch.batch_size, self.num_kv_heads, self._num_sms, max(batch.seq_lens))
        return replace(tiling, block_n=self._decode_block_n)

    def plan(self, batch: ForwardBatch) -> None:
        # Host lists only: grid sizes are decided here, never read back from the device.
        self._is_decode = batch.is_decode
        self._max_extend = max(batch.extend_lens)
        if self._is_decode:
            self._tiling = self._pick_tiling(batch)
        self._cascade = None
        if self._is_decode and batch.cascade is not None and self.supports_cascade:
            self._cascade = TritonCascadePlan.build(batch, batch.cascade, self._cascade_shape)

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        # The kernels multiply q with pool tiles, which needs one element type (an FP8 pool's
        # tiles are upcast to the model's).
        attn_dtype = self.pool.config.attn_dtype
        qc = q if q.dtype == attn_dtype else q.to(attn_dtype)
        opts = self.layer_options[layer]
        if batch.graph is not None:  # replayed from a graph: no plan ran
            out = te.graph_attention(qc, (k_buf, v_buf), batch, self.scale, opts)
        elif self._cascade is not None:
            out = self._cascade.run(qc, (k_buf, v_buf), opts)
        elif self._is_decode:
            table = (batch.kv_indptr, batch.kv_indices)
            out = tk.decode_attention(qc, (k_buf, v_buf), table, self.scale, self._tiling, opts=opts)
        else:
            out = te.extend_attention(
                qc,
                k_buf,
                v_buf,
                batch.qo_indptr,
                batch.kv_indptr,
                batch.kv_indices,
                self.scale,
                max_extend_len=self._max_extend,
                block_m=self._block_m,
                block_n=self._block_n,
                opts=opts,
            )
        return out if out.dtype == q.dtype else out.to(q.dtype)
