"""Decode attention by our Triton split-K kernel, for the FlashInfer backend's decode steps
(and the split rule, `decode_tiling`, that the Triton backend uses too).

Measured on the H200 (`benchmarks/gpu_decode_attention.py`, one layer inside
a CUDA graph, bf16, page size 1): the GQA split-K kernel of
`triton_kernels.decode_attention` reads K/V at 3.0-3.6 TB/s where
FlashInfer's tensor-core decode reaches 2.1-2.3 (qwen2.5-0.5b, 14/2 heads of
64, batch 256), and 4.1-4.3 against 3.4-3.9 TB/s on Llama-8B's 32/8 heads
of 128: 1.2-1.5x faster per layer at batch 256, 1.1-1.4x at 32-64. FlashInfer's
CUDA-core decode kernel does not support qwen's group of 7 at all.

It also needs no host planning: the kernel reads each request's range from
`kv_indptr` on the device, and its grid is (batch, KV heads, splits). So a
CUDA-graph decode state is only a pair of static buffers that each replay's
inputs are copied into, and the split count is fixed per batch size.

`TritonDecode.run(q, cache)` has the call shape of a FlashInfer wrapper's
`run` (`cache` = the page-size-1 `(k, v)` views) and the layer's window and
soft-cap, so the backend treats a planned `TritonDecode` or
`TritonDecodeGraphState` as its active "wrapper". A graph captures each
layer's call with that layer's options: a layer's are always the same.
Importing this module does not import triton; the first run does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.runtime.attention.base import PLAIN_LAYER, LayerOptions
from radixserve.runtime.attention.graph_checks import SharedPageTable
from radixserve.runtime.attention.tiling import DecodeTiling
from radixserve.runtime.forward_batch import ForwardBatch

# Split-K: enough programs (batch x KV heads x splits) to fill the GPU about
# four times over, rounded down to a power of two; the H200 sweep's best split
# counts follow this rule (qwen at batch 32 / 128 / 256: 8 / 2 / 1; Llama at
# batch 64 / 256: 1). A grid with more splits than a request's length needs
# costs more than it saves (measured: a fixed 16-split grid whose programs
# follow each length was 1.1-1.8x slower), so graphs keep this rule too.
_PROGRAM_WAVES = 4
_MAX_SPLITS = 16
# Keys per tile and warps: the sweep's best, or within 5% of it, in every case.
_BLOCK_N = 128
_NUM_WARPS = 4
# Eager steps know their longest context: no split shorter than this many keys.
_MIN_KEYS_PER_SPLIT = 128


def decode_tiling(
    batch_size: int, num_kv_heads: int, num_sms: int, longest: int | None = None
) -> DecodeTiling:
    """The kernel's tiling for a decode batch; `longest` (the longest context, when known) caps
    the splits."""
    want = _PROGRAM_WAVES * num_sms // (batch_size * num_kv_heads)
    cap = _MAX_SPLITS if longest is None else max(1, longest // _MIN_KEYS_PER_SPLIT)
    # A power of two: each count is a compiled kernel, so few distinct ones.
    splits = 1 << (max(1, min(want, _MAX_SPLITS, cap)).bit_length() - 1)
    return DecodeTiling(splits, _BLOCK_N, _NUM_WARPS)


@dataclass
class TritonDecodeGraphState:
    """Static buffers of one captured decode batch size; the graph's kernels read them."""

    batch_size: int
    max_kv_tokens: int
    tiling: DecodeTiling
    scale: float
    kv_indptr: torch.Tensor  # [bs + 1] int32, device
    kv_indices: torch.Tensor  # [max_kv_tokens] int32, device (shared between states)

    def run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], opts: LayerOptions = PLAIN_LAYER
    ) -> torch.Tensor:
        return _run(q, cache, (self.kv_indptr, self.kv_indices), self.scale, self.tiling, opts)


class TritonDecode:
    """The decode side of an attention backend: plan per step (host lists only), run per layer."""

    def __init__(self, num_kv_heads: int, scale: float, device: torch.device) -> None:
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.device = device
        # On the CPU (the interpreter, tests) one "SM": the split rule still has a value.
        on_gpu = device.type == "cuda"
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 1
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tiling: DecodeTiling | None = None
        self._page_table = SharedPageTable(device)

    def plan(self, batch: ForwardBatch) -> None:
        self._table = (batch.kv_indptr, batch.kv_indices)
        self._tiling = decode_tiling(batch.batch_size, self.num_kv_heads, self.num_sms, max(batch.seq_lens))

    def run(
        self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], opts: LayerOptions = PLAIN_LAYER
    ) -> torch.Tensor:
        assert self._table is not None and self._tiling is not None, "run before plan"
        return _run(q, cache, self._table, self.scale, self._tiling, opts)

    def make_graph_state(self, batch_size: int, max_kv_tokens: int) -> TritonDecodeGraphState:
        """Largest batch size first: the first call sizes the shared `kv_indices` buffer."""
        indices = self._page_table.take(batch_size, max_kv_tokens)
        return TritonDecodeGraphState(
            batch_size,
            max_kv_tokens,
            decode_tiling(batch_size, self.num_kv_heads, self.num_sms),
            self.scale,
            torch.zeros(batch_size + 1, dtype=torch.int32, device=self.device),
            indices,
        )


def _run(
    q: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    table: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    tiling: DecodeTiling,
    opts: LayerOptions,
) -> torch.Tensor:
    from radixserve.runtime.attention import triton_kernels as tk  # imports triton: only when used

    return tk.decode_attention(q, tk.token_rows(cache), table, scale, tiling, opts=opts)
