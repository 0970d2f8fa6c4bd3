"""Rotary tables: cos/sin per position, exactly as transformers computes them.

The table covers the rotated dims only (`rotary_dim`, the whole head unless the
config has a `partial_rotary_factor`). Scaled rope types come from transformers'
own init functions (pure functions of the config), so llama3/yarn/linear match
to the bit. LongRoPE (Phi-3) is computed here: transformers picks its short or
long factors per forward, by the longest position in it, which no paged batch
of mixed requests can follow. Here a position below
`original_max_position_embeddings` takes the short factors and one at or past
it the long ones: the same as transformers' `generate` for every prompt up to
that length (its prefill stays short, each later token goes long once past
it), and a pure function of the position, so a cached prefix is valid for
any request that shares it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixserve.model.options import RopeConfig


def rope_tables(
    rope: RopeConfig,
    rotary_dim: int,
    head_dim: int,
    hidden_size: int,
    num_heads: int,
    max_positions: int,
    max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), float32 `[max_positions, rotary_dim / 2]` on the CPU."""
    max_pe = max_position_embeddings or max_positions
    positions = torch.arange(max_positions, dtype=torch.float32)[:, None]
    if rope.type == "longrope":
        short, long, scale = _longrope(rope, rotary_dim, max_pe)
        cut = _original_max(rope)
        freqs = positions * short[None, :]
        freqs[cut:] = positions[cut:] * long[None, :]
    else:
        inv_freq, scale = rope_inv_freq(rope, rotary_dim, head_dim, hidden_size, num_heads, max_pe)
        freqs = positions * inv_freq[None, :]
    return freqs.cos() * scale, freqs.sin() * scale


def rope_inv_freq(
    rope: RopeConfig,
    rotary_dim: int,
    head_dim: int,
    hidden_size: int,
    num_heads: int,
    max_position_embeddings: int,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float32, CPU) and the cos/sin scale of a fixed-frequency rope type."""
    if rope.type == "default":
        inv_freq = 1.0 / (rope.theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        return inv_freq, 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": rope.type, **rope.as_dict()}
    scaling.pop("rope_theta")
    if rotary_dim != head_dim:
        scaling["partial_rotary_factor"] = rotary_dim / head_dim
    proxy = LlamaConfig(  # type: ignore[call-arg]
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope.theta,
        rope_scaling=scaling,
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope.type](proxy, torch.device("cpu"))
    return inv_freq.to(torch.float32), float(scale)


def _longrope(
    rope: RopeConfig, rotary_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(short inverse frequencies, long ones, cos/sin scale): transformers'
    `_compute_longrope_parameters`, operation for operation."""
    p = dict(rope.params)
    original = _original_max(rope)
    factor = p.get("factor") or max_position_embeddings / original
    assert isinstance(factor, int | float)
    scale = p.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    assert isinstance(scale, int | float)
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    base = rope.theta**shape

    def inv(factors: object) -> torch.Tensor:
        assert isinstance(factors, tuple)
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base)

    return inv(p["short_factor"]), inv(p["long_factor"]), float(scale)


def _original_max(rope: RopeConfig) -> int:
    value = dict(rope.params)["original_max_position_embeddings"]
    assert isinstance(value, int)
    return value
