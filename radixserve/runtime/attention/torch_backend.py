"""Reference attention in plain PyTorch: one SDPA call per request
(one batched, padded call for a decode step).

Correct on any device and the yardstick for the Triton and FlashInfer
backends; slow on a GPU (a Python loop over requests). A decode step that
carries shared-prefix groups takes the cascade path (torch_cascade.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.attention.torch_cascade import TorchCascadePlan, cascade_forward, plan_cascade
from radixserve.runtime.forward_batch import ForwardBatch


class TorchAttention(AttentionBackend):
    name = "torch"
    supports_cascade = True

    def plan(self, batch: ForwardBatch) -> None:
        # Host-side offsets, so the per-layer loop slices without device syncs.
        self._qo = [0]
        self._kv = [0]
        for p, e in zip(batch.prefix_lens, batch.extend_lens):
            self._qo.append(self._qo[-1] + e)
            self._kv.append(self._kv[-1] + p + e)
        self._masks: dict[tuple[int, int], torch.Tensor] = {}
        self._decode: tuple[torch.Tensor, torch.Tensor] | None = None
        self._cascade: TorchCascadePlan | None = None
        if batch.cascade is not None and batch.is_decode:
            self._cascade = plan_cascade(batch, batch.cascade)
        elif batch.is_decode and batch.batch_size > 1:
            self._decode = self._plan_decode(batch)

    def _plan_decode(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots padded to the longest context `[B, L]`, and the mask of real ones:
        a decode step then takes one batched SDPA per layer instead of B calls."""
        lens = torch.tensor(batch.seq_lens, device=batch.kv_indices.device)
        width = max(batch.seq_lens)
        cols = torch.arange(width, device=lens.device)[None, :]
        valid = cols < lens[:, None]
        starts = torch.tensor(self._kv[:-1], device=lens.device)[:, None]
        idx = torch.where(valid, starts + cols, torch.zeros_like(cols))
        return batch.kv_indices.long()[idx], valid[:, None, None, :]

    def _mask(self, prefix: int, extend: int, device: torch.device) -> torch.Tensor:
        key = (prefix, extend)
        if key not in self._masks:
            q_pos = torch.arange(prefix, prefix + extend, device=device)[:, None]
            kv_pos = torch.arange(prefix + extend, device=device)[None, :]
            self._masks[key] = kv_pos <= q_pos
        return self._masks[key]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.pool.write(layer, batch.out_slots, k, v)
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        gqa = self.num_heads != self.num_kv_heads
        if self._cascade is not None:
            return cascade_forward(q, k_buf, v_buf, self._cascade, self.scale)
        if self._decode is not None:
            slots, dmask = self._decode
            kb = k_buf[slots].transpose(1, 2).to(q.dtype)  # [B, Hkv, L, D]
            vb = v_buf[slots].transpose(1, 2).to(q.dtype)
            o = F.scaled_dot_product_attention(
                q[:, :, None, :], kb, vb, attn_mask=dmask, scale=self.scale, enable_gqa=gqa
            )
            return o[:, :, 0, :]
        out = torch.empty_like(q)
        for i, (prefix, extend) in enumerate(zip(batch.prefix_lens, batch.extend_lens)):
            q0, q1 = self._qo[i], self._qo[i + 1]
            slots = batch.kv_indices[self._kv[i] : self._kv[i + 1]]
            qi = q[q0:q1].transpose(0, 1)  # [Hq, n, D]
            ki = k_buf[slots].transpose(0, 1).to(q.dtype)  # [Hkv, L, D]
            vi = v_buf[slots].transpose(0, 1).to(q.dtype)
            mask = None if extend == 1 else self._mask(prefix, extend, q.device)
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
            out[q0:q1] = oi.transpose(0, 1)
        return out
