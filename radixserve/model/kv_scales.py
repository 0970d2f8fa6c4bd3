"""A checkpoint's FP8 KV cache scales: one float per layer for K and one for V.

Read under the names FP8 checkpoints use (vLLM and SGLang read the same): `*.self_attn.k_scale`
/ `*.self_attn.v_scale` (compressed-tensors' `kv_cache_scheme`, transformers' FP8), or the
older `*.self_attn.k_proj.output_scale` / `v_proj.output_scale`. They are set aside while the
weights load, and used only by an FP8 KV cache (`EngineConfig.kv_cache_dtype`); without them
the scales are 1.0.
"""

from __future__ import annotations

import re

import torch

from radixserve.cache.kv_quant import KVScales

_SUFFIXES = {
    "self_attn.k_scale": "k",
    "self_attn.v_scale": "v",
    "self_attn.k_proj.output_scale": "k",
    "self_attn.v_proj.output_scale": "v",
}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


class KVScaleReader:
    """Collects the KV scales among a checkpoint's tensors (`take`), then `scales()`."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._found: dict[str, dict[int, float]] = {"k": {}, "v": {}}

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """Keep `tensor` when `name` is a layer's K or V cache scale (a one-element tensor)."""
        m = _LAYER.search(name)
        which = _SUFFIXES.get(m.group(2)) if m else None
        if m is None or which is None:
            return False
        if tensor.numel() != 1:
            raise ValueError(
                f"KV cache scale {name!r} has shape {tuple(tensor.shape)}: one per tensor is supported"
            )
        value = float(tensor.float().reshape(()))
        if not value > 0 or value == float("inf"):
            raise ValueError(f"KV cache scale {name!r} is {value}: must be finite and > 0")
        self._found[which][int(m.group(1))] = value
        return True

    def scales(self) -> KVScales | None:
        """Every layer's K and V scale, or None when the checkpoint has none."""
        k, v = self._found["k"], self._found["v"]
        if not k and not v:
            return None
        layers = set(range(self.num_layers))
        for which, got in (("k_scale", k), ("v_scale", v)):
            missing = sorted(layers - set(got))
            if missing:
                raise ValueError(f"the checkpoint's KV cache scales lack {which} for layers {missing[:8]}")
        return KVScales(
            tuple(k[i] for i in range(self.num_layers)), tuple(v[i] for i in range(self.num_layers))
        )
