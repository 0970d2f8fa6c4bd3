"""Reference attention in plain PyTorch: one batched, padded SDPA call for
the decode rows (one new token each) of a step, and one SDPA call per
request for the rest (prefill chunks, jump-forward extends).

Correct on any device and the yardstick for the Triton and FlashInfer
backends; slow on a GPU (a Python loop over requests). The decode rows of
a mixed step (decode tokens beside prefill chunks) take the batched call
too: on the CPU a per-request call costs about as much as a whole batched
one. A decode step that carries shared-prefix groups takes the cascade path
(torch_cascade.py), unless the model has windows or a soft-cap (torch_masked.py):
its decode rows then take the padded call, whose mask carries the windows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.cache.kv_quant import dequantize
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.attention.torch_cascade import TorchCascadePlan, cascade_forward, plan_cascade
from radixserve.runtime.attention.torch_masked import attention, causal_mask, window_valid
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild

_Decode = tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]


class TorchAttention(AttentionBackend):
    name = "torch"

    @property
    def supports_cascade(self) -> bool:
        # The cascade path reads each shared prefix whole: no windows, no soft-cap there.
        return self.options.plain

    @property
    def supports_windows(self) -> bool:
        return True

    @property
    def supports_logit_softcap(self) -> bool:
        return True

    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        return []  # plain PyTorch ops: nothing compiles

    def plan(self, batch: ForwardBatch) -> None:
        # Host-side offsets, so the per-layer loop slices without device syncs.
        self._qo = [0]
        self._kv = [0]
        for p, e in zip(batch.prefix_lens, batch.extend_lens):
            self._qo.append(self._qo[-1] + e)
            self._kv.append(self._kv[-1] + p + e)
        self._masks: dict[tuple[int, int, int | None], torch.Tensor | None] = {}
        # Decode rows in one batched call: (their q rows, None when every row decodes;
        # padded slots; mask of real keys; context lengths). `_loop`: the requests that
        # take a call each. `_decode_masks`: the mask per window, made on first use.
        self._decode: _Decode | None = None
        self._decode_masks: dict[int | None, torch.Tensor] = {}
        self._loop: Sequence[int] = range(batch.batch_size)
        self._cascade: TorchCascadePlan | None = None
        if batch.cascade is not None and batch.is_decode and self.supports_cascade:
            self._cascade = plan_cascade(batch, batch.cascade)
            return
        ones = [i for i, e in enumerate(batch.extend_lens) if e == 1]
        if len(ones) > 1:
            self._decode = self._plan_decode(batch, ones)
            self._loop = [i for i, e in enumerate(batch.extend_lens) if e != 1]

    def _plan_decode(self, batch: ForwardBatch, rows: list[int]) -> _Decode:
        """The q rows of requests `rows` (one new token each), their slots padded to the
        longest context `[R, L]`, and the mask of real ones: one batched SDPA per layer
        instead of R calls."""
        device = batch.kv_indices.device
        seq = [self._kv[i + 1] - self._kv[i] for i in rows]
        lens = torch.tensor(seq, device=device)
        cols = torch.arange(max(seq), device=device)[None, :]
        valid = cols < lens[:, None]
        starts = torch.tensor([self._kv[i] for i in rows], device=device)[:, None]
        idx = torch.where(valid, starts + cols, torch.zeros_like(cols))
        q_rows = None
        if len(rows) < batch.batch_size:
            q_rows = torch.tensor([self._qo[i] for i in rows], device=device)
        return q_rows, batch.kv_indices.long()[idx], valid, lens

    def _batched_decode(self, q: torch.Tensor, layer: int, gqa: bool, window: int | None) -> torch.Tensor:
        assert self._decode is not None
        q_rows, slots, valid, lens = self._decode
        if window not in self._decode_masks:
            mask = valid if window is None else window_valid(valid, lens, window)
            self._decode_masks[window] = mask[:, None, None, :]
        qd = q if q_rows is None else q[q_rows]
        kb, vb = self._read(layer, slots, q.dtype)
        kb, vb = kb.transpose(1, 2), vb.transpose(1, 2)  # [R, Hkv, L, D]
        o = attention(
            qd[:, :, None, :], kb, vb, self._decode_masks[window], self.scale, self.options.logit_softcap, gqa
        )
        return o[:, :, 0, :]

    def _mask(
        self, prefix: int, extend: int, window: int | None, device: torch.device
    ) -> torch.Tensor | None:
        """The request's mask; None when it sees every key (one new token inside its window)."""
        key = (prefix, extend, window)
        if key not in self._masks:
            sees_all = extend == 1 and (window is None or prefix < window)
            self._masks[key] = None if sees_all else causal_mask(prefix, extend, window, device)
        return self._masks[key]

    def _read(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V at `slots` in `dtype` (an FP8 pool's dequantized: kv_quant.py)."""
        c = self.pool.config
        k = dequantize(self.pool.k[layer][slots], c.k_scale(layer), dtype)
        return k, dequantize(self.pool.v[layer][slots], c.v_scale(layer), dtype)

    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        gqa = self.num_heads != self.num_kv_heads
        window = self.options.window(layer)
        if self._cascade is not None:
            return cascade_forward(
                q, self._cascade, self.scale, lambda s: self._read(layer, s, torch.float32)
            )
        if self._decode is not None and self._decode[0] is None:  # a decode step
            return self._batched_decode(q, layer, gqa, window)
        out = torch.empty_like(q)
        if self._decode is not None:  # the decode rows of a mixed step
            out[self._decode[0]] = self._batched_decode(q, layer, gqa, window)
        for i in self._loop:
            prefix, extend = batch.prefix_lens[i], batch.extend_lens[i]
            q0, q1 = self._qo[i], self._qo[i + 1]
            slots = batch.kv_indices[self._kv[i] : self._kv[i + 1]]
            qi = q[q0:q1].transpose(0, 1)  # [Hq, n, D]
            ki, vi = self._read(layer, slots, q.dtype)
            ki, vi = ki.transpose(0, 1), vi.transpose(0, 1)  # [Hkv, L, D]
            mask = self._mask(prefix, extend, window, q.device)
            oi = attention(qi, ki, vi, mask, self.scale, self.options.logit_softcap, gqa)
            out[q0:q1] = oi.transpose(0, 1)
        return out
