"""`ModelConfig`: the shape and options of a Llama-family model, read once from a HF config.

Everything the model layer, the KV pool and the runner need is here as plain
values, so nothing downstream reads a transformers config object. Reading
handles both config styles: transformers 5 (`rope_parameters`) and 4.x
(`rope_theta` + `rope_scaling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixserve.cache.kv_pool import KVPoolConfig

# Rope types whose frequencies are fixed at init. "dynamic" and "longrope"
# change with the sequence length in transformers, which a paged batch of
# mixed lengths cannot reproduce, so they are refused rather than run wrong.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# model_type -> the HF architecture name a config without `architectures` stands for.
DEFAULT_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_MODEL_TYPES = tuple(DEFAULT_ARCHITECTURE)

RopeValue = float | int | bool | str | None


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    type: str = "default"
    # The scaling fields (factor, low_freq_factor, original_max_position_embeddings, ...),
    # sorted by name; a tuple so the config stays hashable.
    params: tuple[tuple[str, RopeValue], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """transformers 5's `rope_parameters` layout."""
        return {"rope_theta": self.theta, "rope_type": self.type, **dict(self.params)}


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
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before rope
    # Sliding-window attention is run as full attention with the context capped
    # at the window (see `max_context_len`): identical while no sequence is longer.
    sliding_window: int | None = None
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
        return self.head_dim**-0.5

    @property
    def max_context_len(self) -> int:
        """Longest sequence (prompt + output) this model computes exactly."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

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
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if architecture is None:
            archs = getattr(hf_config, "architectures", None) or []
            architecture = archs[0] if archs else DEFAULT_ARCHITECTURE[model_type]
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported: the Llama-family MLP here is SiLU-gated")
        num_heads = int(hf_config.num_attention_heads)
        num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}"
            )
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        return cls(
            architecture=architecture,
            model_type=model_type,
            vocab_size=int(hf_config.vocab_size),
            hidden_size=int(hf_config.hidden_size),
            intermediate_size=int(hf_config.intermediate_size),
            num_layers=int(hf_config.num_hidden_layers),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=int(head_dim),
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope=_read_rope(hf_config),
            max_position_embeddings=int(hf_config.max_position_embeddings),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            # Qwen2's q/k/v always carry a bias and its o_proj never does.
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=attention_bias if model_type in ("llama", "qwen3") else False,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
            sliding_window=_read_sliding_window(hf_config, model_type),
            bos_token_id=getattr(hf_config, "bos_token_id", None),
            eos_token_ids=_as_ids(getattr(hf_config, "eos_token_id", None)),
        )


def _as_ids(value: int | list[int] | tuple[int, ...] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _read_rope(hf_config: Any) -> RopeConfig:
    params = getattr(hf_config, "rope_parameters", None)
    if params is None:  # transformers 4.x
        params = {"rope_theta": getattr(hf_config, "rope_theta", 10000.0), **(hf_config.rope_scaling or {})}
    params = dict(params)
    if "layer_types" in params or any(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer rope parameters are not supported")
    theta = float(params.pop("rope_theta"))
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor={partial} is not supported: rope covers the whole head")
    return RopeConfig(theta=theta, type=rope_type, params=tuple(sorted(params.items())))


def _read_sliding_window(hf_config: Any, model_type: str) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    if window is None:
        return None
    if model_type == "mistral":
        return int(window)
    # Qwen2/3 carry a window value even when no layer uses it.
    uses = getattr(hf_config, "use_sliding_window", False) or "sliding_attention" in (
        getattr(hf_config, "layer_types", None) or ()
    )
    return int(window) if uses else None


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


def plain_hf_config(raw: dict[str, Any]) -> Any | None:
    """config.json as an attribute view that `ModelConfig.from_hf` reads like a
    transformers config, when that is certain to give the same ModelConfig; else None
    (the caller then asks transformers). Covers the plain case: a supported model
    type, every key with a type-dependent default present, unscaled rope."""
    from types import SimpleNamespace

    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
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
