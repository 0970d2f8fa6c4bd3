"""Batch-invariant attention in Triton (`EngineConfig(deterministic=True)` on CUDA).

One program per (new token, KV head): the token's query heads of that KV head
attend to its request's keys 0..its position, in `BLOCK_N` tiles aligned to
position 0, through the shared online softmax (`triton_softmax.attend_tile`).
The tiles a token walks depend on its position alone, never on the batch, on
its request's other tokens in the step, nor on how its prompt was split into
chunks or a cached prefix: a prefill token and the same token decoded later
sum in the same order. Every launch is the same compiled kernel (no split-K,
no per-batch tiling; decode and extend alike), so the order is fixed.

It costs: no key tile is shared between a request's tokens (a prefill chunk
reads its context once per token) and decode has no split-K for long contexts.

Decode steps replay CUDA graphs (`decode_graphs()`): a decode row's new token is the last
of its context, so its position and context start follow from `kv_indptr` on the device
(`InvariantDecodeGraphState.derive_rows`, inside the graph) and the graph needs no host
plan. The graph launches the same compiled kernel as an eager step, so a token decoded in
a replay and one decoded in an eager mixed step sum in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixserve.cache.kv_pool import KVPool
from radixserve.host_copy import to_device
from radixserve.runtime.attention.base import (
    AttentionBackend,
    AttentionOptions,
    CascadeGraphState,
    DecodeGraphPlanner,
    DecodeGraphState,
    KernelBuild,
    LayerOptions,
)
from radixserve.runtime.attention.graph_checks import SharedPageTable, check_graph_batch, load_page_table
from radixserve.runtime.attention.invariant_rows import token_positions
from radixserve.runtime.attention.triton_kernels import check_qkv, dot_precision
from radixserve.runtime.attention.triton_softmax import LOG2E, attend_tile, layer_args, normalized
from radixserve.runtime.attention.warm_batches import per_layer_option
from radixserve.runtime.forward_batch import ForwardBatch


@triton.jit(do_not_specialize=["window"])
def _token_attention_kernel(
    Q,
    K,
    V,
    kv_indices,
    Pos,
    Start,
    Out,
    sm_scale_log2,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_ot,
    stride_oh,
    window,
    cap_log2,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: new token t, KV head hk; keys 0..Pos[t] at kv_indices[Start[t]:]."""
    t = tl.program_id(0)
    hk = tl.program_id(1)
    pos = tl.load(Pos + t)
    start = tl.load(Start + t)
    first = 0
    if HAS_WINDOW:  # the window's first tile, still aligned to position 0
        first = (tl.maximum(pos + 1 - window, 0) // BLOCK_N) * BLOCK_N

    offs_g = tl.arange(0, BLOCK_H)
    offs_h = hk * GROUP + offs_g
    h_mask = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
        mask=h_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for key0 in range(first, pos + 1, BLOCK_N):
        offs_n = key0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n <= pos
        if HAS_WINDOW:
            n_mask &= offs_n > pos - window
        slots = tl.load(kv_indices + start + offs_n, mask=n_mask, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(
            q,
            K + hk * stride_kh,
            V + hk * stride_vh,
            slots,
            n_mask,
            n_mask[None, :],
            stride_kn,
            stride_vn,
            offs_d,
            d_mask,
            sm_scale_log2,
            cap_log2,
            m_i,
            l_i,
            acc,
            DOT_PRECISION,
            HAS_SOFTCAP,
            False,  # KV_FP8: deterministic mode keeps the model's KV dtype (config.py refuses FP8)
        )
    out, _ = normalized(acc, l_i, m_i)
    tl.store(
        Out + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=h_mask[:, None] & d_mask[None, :],
    )


def token_attention(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    kv_indices: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor],
    sm_scale: float,
    block_n: int,
    opts: LayerOptions,
) -> torch.Tensor:
    """q `[T, Hq, D]` over the layer's pool buffers `kv` (`[S, Hkv, D]`); `rows`: each token's
    position and context start in `kv_indices` (int32 `[T]` each) -> `[T, Hq, D]`."""
    k_pool, v_pool = kv
    q = check_qkv(q, k_pool, v_pool)
    out = torch.empty_like(q)
    t, num_heads, head_dim = q.shape
    if not t:
        return out
    num_kv_heads = k_pool.shape[1]
    group = num_heads // num_kv_heads
    _token_attention_kernel[(t, num_kv_heads)](
        q,
        k_pool,
        v_pool,
        kv_indices,
        rows[0],
        rows[1],
        out,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),  # tl.dot needs 16 rows
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=4,
        **layer_args(opts),
    )
    return out


@dataclass
class InvariantDecodeGraphState:
    """Static buffers of one captured decode batch size; the graph's kernels read them."""

    batch_size: int
    max_kv_tokens: int
    kv_indptr: torch.Tensor  # [bs + 1] int32, device
    kv_indices: torch.Tensor  # [max_kv_tokens] int32, device (shared between states)
    rows: torch.Tensor  # [2, bs] int32, device: each row's position and context start

    def derive_rows(self) -> None:
        """Row i's position is its context length - 1, its start `kv_indptr[i]`: on the device."""
        torch.diff(self.kv_indptr, out=self.rows[0])
        self.rows[0].sub_(1)
        self.rows[1].copy_(self.kv_indptr[:-1])


class InvariantTritonAttention(AttentionBackend):
    name = "triton-invariant"
    triton_kernels = True

    @property
    def supports_windows(self) -> bool:
        return True

    @property
    def supports_logit_softcap(self) -> bool:
        return True

    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        options: AttentionOptions | None = None,
    ) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale, options)
        on_gpu = torch.device(pool.config.device).type == "cuda"
        # The interpreter's cost is per program step: small tiles there. One size per engine.
        self._block_n = (32 if pool.config.dtype == torch.float32 else 64) if on_gpu else 16
        self._device = torch.device(pool.config.device)
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graph: InvariantDecodeGraphState | None = None  # the state a replayed step runs
        self._page_table = SharedPageTable(self._device)

    @property
    def device_planned(self) -> bool:
        return True

    @property
    def cascade_graphs(self) -> bool:
        return False  # deterministic mode forms no shared-prefix groups

    def decode_graphs(self) -> DecodeGraphPlanner:
        return self

    def make_cuda_graph_decode_state(self, batch_size: int, max_kv_tokens: int) -> InvariantDecodeGraphState:
        """Largest batch size first: the first call sizes the shared `kv_indices` buffer."""
        indices = self._page_table.take(batch_size, max_kv_tokens)
        return InvariantDecodeGraphState(
            batch_size,
            max_kv_tokens,
            torch.zeros(batch_size + 1, dtype=torch.int32, device=self._device),
            indices,
            torch.zeros(2, batch_size, dtype=torch.int32, device=self._device),
        )

    def plan_cuda_graph(self, state: DecodeGraphState, batch: ForwardBatch) -> None:
        """Copy a padded decode batch's page table into the state (in device-input mode the
        graph's `step_fill` writes it instead); the rows follow inside the graph."""
        check_graph_batch(state, batch)
        assert isinstance(state, InvariantDecodeGraphState)
        load_page_table(state, batch)
        self._graph = state

    def make_cuda_graph_cascade_state(self, plain: DecodeGraphState) -> CascadeGraphState:
        raise TypeError("the batch-invariant backend has no cascade graphs (cascade_graphs is False)")

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """The one kernel, per layer variant, from a prefill and from a decode step (no cascade)."""
        builds = per_layer_option(self, "triton invariant", "extend")
        return builds + per_layer_option(self, "triton invariant", "decode")

    def plan(self, batch: ForwardBatch) -> None:
        pos, start = token_positions(batch)
        # One pinned copy per array, queued on the stream (host_copy): no sync.
        self._rows = (to_device(pos, torch.int32, self._device), to_device(start, torch.int32, self._device))
        self._graph = None

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if self._graph is not None:  # a graph's step: its kv_indices, rows from its kv_indptr
            if layer == 0:  # once per step, before the first layer reads them
                self._graph.derive_rows()
            kv_indices, rows = self._graph.kv_indices, (self._graph.rows[0], self._graph.rows[1])
        else:
            assert self._rows is not None, "attend before plan()"
            kv_indices, rows = batch.kv_indices, self._rows
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        qc = q if q.dtype == k_buf.dtype else q.to(k_buf.dtype)
        out = token_attention(
            qc,
            (k_buf, v_buf),
            kv_indices,
            rows,
            self.scale,
            self._block_n,
            self.layer_options[layer],
        )
        return out if out.dtype == q.dtype else out.to(q.dtype)
