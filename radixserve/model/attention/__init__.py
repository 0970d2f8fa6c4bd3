"""Attention backends behind one interface; GPU ones import their libraries lazily."""

from __future__ import annotations

from radixserve.model.attention.base import AttentionBackend
from radixserve.model.attention.torch_backend import TorchAttention

__all__ = ["AttentionBackend", "TorchAttention"]
