"""CUDA graphs for extend steps: prefill chunks and mixed prefill + decode steps.

An eager extend step of a 32-layer model launches ~400 kernels from Python;
on the H200 that took 16 ms of host time per mixed step of Llama-3.1-8B
(benchmarks/profile_w4.py), twice the decode step beside it, and every
request decoding in that step waited for it. Replaying a graph makes the
step one launch.

A graph is captured per token bucket (`token_buckets`: a step of T new tokens
replays the smallest bucket of at least T, padding the rest) for up to
`max_rows` requests. What the step's shape would otherwise decide on the host
lives in static device buffers that `run` fills before the replay:

- the token rows (ids, positions, out slots; padding tokens write the scratch
  slot, which belongs to no request, and no request attends to them);
- `qo_indptr` / `kv_indptr` over `max_rows` requests (padding requests are
  empty) and the context slots, `kv_indices`;
- the logit rows: each request's last new token (padding: row 0);
- the logit rows (each sampling request's last new token; padding: row 0);
- attention (`ForwardBatch.graph`, runtime/attention/triton_extend.py
  `graph_attention`): the step's leading one-token rows (decode rows come
  first) run the split-K decode kernel through `decode_indptr`, the rest the
  extend kernel through a tile table (`extend_tiles`) that stands in for its
  host-sized grid. Both backends run these Triton kernels without a plan, so
  FlashInfer's prefill wrapper is not used inside graphs.

Steps with more logit rows than `max_rows` (prompt logprobs) or more tokens
than the largest bucket run eagerly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.forward_batch import ForwardBatch, GraphAttention

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what torch.cuda.graph_pool_handle() returns

# Fine steps where mixed steps live (decode rows + up to `mixed_prefill_tokens`): padding
# tokens cost GEMM time like real ones.
LADDER = (64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 3072, 4096)


def token_buckets(max_tokens: int) -> list[int]:
    sizes = [t for t in LADDER if t < max_tokens]
    return [*sizes, max_tokens]


class ExtendGraphs:
    def __init__(
        self,
        model: nn.Module,
        attn: AttentionBackend,
        max_rows: int,
        max_tokens: int,
        max_kv_tokens: int,
        scratch_slot: int,
        device: torch.device,
    ) -> None:
        from radixserve.runtime.attention.triton_extend import GRAPH_BLOCK_M  # imports triton

        self.model, self.attn, self.device = model, attn, device
        self.block_m = GRAPH_BLOCK_M
        self.sizes = token_buckets(max_tokens)
        self.max_rows, self.scratch = max_rows, scratch_slot
        n, r = self.sizes[-1], max_rows
        self.max_kv_tokens = max_kv_tokens
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_slots = torch.full((n,), scratch_slot, dtype=torch.int64, device=device)
        self.qo_indptr = torch.zeros(r + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(r + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.full((max_kv_tokens,), scratch_slot, dtype=torch.int32, device=device)
        self.logit_rows = torch.zeros(r, dtype=torch.int64, device=device)
        self.tiles = torch.full((self._tile_cap(n), 2), -1, dtype=torch.int32, device=device)
        self.decode_indptr = torch.zeros(r + 1, dtype=torch.int32, device=device)
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # One float32 `[max_rows, vocab]` output for every bucket (each graph ends with a
        # copy into it): kept per bucket, 17 of them would hold ~2.5 GB for a 150k vocabulary.
        self.logits: torch.Tensor | None = None
        self.batches: dict[int, ForwardBatch] = {}

    def _tile_cap(self, tokens: int) -> int:
        """Tiles enough for any step of `tokens` new tokens over up to `max_rows` requests."""
        return tokens // self.block_m + self.max_rows

    def _static_batch(self, tokens: int) -> ForwardBatch:
        from radixserve.runtime.attention.triton_decode import decode_tiling

        d = min(tokens, self.max_rows)  # decode rows at most: one token each
        tiling = decode_tiling(d, self.attn.num_kv_heads, self.num_sms)
        graph = GraphAttention(self.tiles[: self._tile_cap(tokens)], self.decode_indptr[: d + 1], tiling)
        return ForwardBatch(
            input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens],
            out_slots=self.out_slots[:tokens],
            qo_indptr=self.qo_indptr,
            kv_indptr=self.kv_indptr,
            kv_indices=self.kv_indices,
            # Host lists as a backend would plan them; replays read only the device buffers.
            extend_lens=[tokens] + [0] * (self.max_rows - 1),
            prefix_lens=[0] * self.max_rows,
            logit_rows=self.logit_rows,
            graph=graph,
        )

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream, pool: _POOL_HANDLE | None = None) -> None:
        """Capture every bucket, largest first, into `pool` (shared with the decode graphs)."""
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream(self.device))
        for tokens in sorted(self.sizes, reverse=True):
            batch = self._static_batch(tokens)
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up (lazy inits, Triton builds) outside the graph
                    out = self.model(batch, self.attn)
                if self.logits is None:
                    self.logits = torch.empty_like(out)
                del out
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.logits.copy_(self.model(batch, self.attn))
            self.graphs[tokens] = graph
            self.batches[tokens] = batch
        torch.cuda.synchronize(self.device)

    def can_run(self, fb: ForwardBatch) -> bool:
        return (
            not fb.is_decode
            and fb.cascade is None
            and (fb.logit_rows is None or fb.logit_rows.numel() <= self.max_rows)
            and fb.num_tokens <= self.sizes[-1]
            and fb.batch_size <= self.max_rows
            and fb.kv_indices.numel() <= self.max_kv_tokens
        )

    def run(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits of an extend step (`fb.logit_rows`, or each request's last new token), by replay."""
        t, b, kv = fb.num_tokens, fb.batch_size, fb.kv_indices.numel()
        tokens = next(s for s in self.sizes if s >= t)
        lens = np.asarray(fb.extend_lens)
        n_dec = int(np.argmax(lens != 1)) if (lens != 1).any() else b  # leading one-token rows
        host = torch.from_numpy(self._tiles(fb.extend_lens, tokens, n_dec)).pin_memory()
        self.input_ids[:t].copy_(fb.input_ids)
        self.positions[:t].copy_(fb.positions)
        self.out_slots[:t].copy_(fb.out_slots)
        self.out_slots[t:tokens].fill_(self.scratch)  # padding tokens: never a request's slot
        self.qo_indptr[: b + 1].copy_(fb.qo_indptr)
        self.qo_indptr[b + 1 :].fill_(t)
        self.kv_indptr[: b + 1].copy_(fb.kv_indptr)
        self.kv_indptr[b + 1 :].fill_(kv)
        self.kv_indices[:kv].copy_(fb.kv_indices)
        self.decode_indptr[: n_dec + 1].copy_(fb.kv_indptr[: n_dec + 1])
        self.decode_indptr[n_dec + 1 :].copy_(fb.kv_indptr[n_dec : n_dec + 1].expand(self.max_rows - n_dec))
        rows = fb.last_token_rows() if fb.logit_rows is None else fb.logit_rows
        n = rows.numel()
        self.logit_rows[:n].copy_(rows)
        self.logit_rows[n:].zero_()
        self.tiles[: host.shape[0]].copy_(host, non_blocking=True)
        self.graphs[tokens].replay()
        assert self.logits is not None
        return self.logits[:n]

    def _tiles(self, extend_lens: list[int], tokens: int, first: int) -> np.ndarray:
        from radixserve.runtime.attention.triton_extend import extend_tiles

        return extend_tiles(extend_lens, self.block_m, self._tile_cap(tokens), first)
