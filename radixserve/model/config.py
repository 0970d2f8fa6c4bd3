"""`ModelConfig`: the shape and options of a decoder-only model, read once from a HF config.

Everything the model layer, the KV pool and the runner need is here as plain
values, so nothing downstream reads a transformers config object. The families
(Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, Mixtral, Qwen2/3-MoE) differ only in
these options; `hf_read.py` reads them from either config style (transformers 5's
`rope_parameters`, 4.x's `rope_theta` + `rope_scaling`) and refuses, naming the
field, what the model classes do not compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixserve.cache.kv_pool import KVPoolConfig
from radixserve.model.hf_read import read_model_fields
from radixserve.model.options import MoEConfig, RopeConfig
from radixserve.runtime.attention.base import AttentionOptions

__all__ = ["ModelConfig", "MoEConfig", "RopeConfig", "plain_hf_config"]


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False  # Qwen2, Llama with attention_bias
    o_bias: bool = False  # Llama with attention_bias, Qwen3 with attention_bias
    mlp_bias: bool = False  # Llama with mlp_bias
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over head_dim on q and k before rope
    # Per layer: the sliding window (positions a query sees, its own included), None for
    # full attention; empty when no layer has one. Computed as a mask over positions.
    layer_windows: tuple[int | None, ...] = ()
    # The rope of the windowed layers, when it differs from `rope` (Gemma 3's local base).
    local_rope: RopeConfig | None = None
    rotary_dim: int | None = None  # rotated leading dims of a head; None: all (partial rotary)
    activation: str = "silu"  # of the gated MLP: "silu" or "gelu_tanh"
    norm_plus_one: bool = False  # Gemma: norms scale by (1 + weight)
    # Gemma 2/3: the attention output and the MLP output are normed before their residual
    # add, and the MLP input has its own norm (pre_/post_feedforward_layernorm).
    sandwich_norms: bool = False
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None  # Gemma: logits scaled by its -1/2 power, not head_dim's
    attn_logit_softcap: float | None = None  # Gemma 2: cap * tanh(logits / cap)
    final_logit_softcap: float | None = None  # Gemma 2: the same over the output logits
    fused_checkpoint: bool = False  # Phi-3: qkv_proj and gate_up_proj stored fused
    moe: MoEConfig | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_scale(self) -> float:
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar**-0.5)
        return float(self.head_dim**-0.5)

    @property
    def rope_dim(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def max_context_len(self) -> int:
        """Longest sequence (prompt + output) this model computes exactly, windows included
        (an attention backend without windows caps the engine's context further)."""
        return self.max_position_embeddings

    def attention_options(self) -> AttentionOptions:
        return AttentionOptions(windows=self.layer_windows, logit_softcap=self.attn_logit_softcap)

    def layer_rope(self, layer: int) -> RopeConfig:
        """The rope of `layer`: the local one on windowed layers when the model has one."""
        windowed = bool(self.layer_windows) and self.layer_windows[layer] is not None
        return self.local_rope if windowed and self.local_rope is not None else self.rope

    def kv_pool_config(self, dtype: torch.dtype, device: torch.device | str) -> KVPoolConfig:
        return KVPoolConfig(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=dtype,
            device=str(device),
        )

    @classmethod
    def from_hf(cls, hf_config: Any, architecture: str | None = None) -> ModelConfig:
        """Read a transformers config; raise `ValueError` naming what is not supported."""
        return cls(**read_model_fields(hf_config, architecture))


# Keys whose transformers default differs between model types (or from ours): a
# config.json without one of them is read by transformers, which knows the default.
_REQUIRED_KEYS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
)
_REQUIRED_BY_TYPE = {"mistral": ("sliding_window",), "qwen3": ("head_dim",)}
# The model types whose plain config.json reads here as transformers reads it.
_PLAIN_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def plain_hf_config(raw: dict[str, Any]) -> Any | None:
    """config.json as an attribute view that `ModelConfig.from_hf` reads like a
    transformers config, when that is certain to give the same ModelConfig; else None
    (the caller then asks transformers). Covers the plain case: a Llama, Mistral or Qwen2/3 model
    type, every key with a type-dependent default present, unscaled rope, no windows
    chosen per layer."""
    from types import SimpleNamespace

    model_type = raw.get("model_type")
    if model_type not in _PLAIN_TYPES or raw.get("use_sliding_window"):
        return None
    if any(t != "full_attention" for t in raw.get("layer_types") or ()):
        return None
    if any(k not in raw for k in _REQUIRED_KEYS + _REQUIRED_BY_TYPE.get(model_type, ())):
        return None
    rope = raw.get("rope_parameters")
    if rope is not None:
        plain_rope = isinstance(rope, dict) and set(rope) <= {"rope_theta", "rope_type"}
        if not plain_rope or rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
            return None
    elif "rope_theta" not in raw or raw.get("rope_scaling") is not None:
        return None
    return SimpleNamespace(**{"rope_scaling": None, **raw})
