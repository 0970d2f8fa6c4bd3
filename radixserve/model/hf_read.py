"""Reading a transformers config into `ModelConfig` fields, family by family.

Each supported `model_type` maps to the options its modeling code uses; every
value the model classes cannot compute is refused here, at load, with one
message that names the config field (an activation, a rope type, an attention
option), rather than run wrong.
"""

from __future__ import annotations

import math
from typing import Any

from radixserve.model.options import MoEConfig, RopeConfig, RopeValue

# model_type -> the HF architecture name a config without `architectures` stands for.
DEFAULT_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
SUPPORTED_MODEL_TYPES = tuple(DEFAULT_ARCHITECTURE)
# Rope types whose frequencies are a function of the position alone ("longrope": see
# rope.py). "dynamic" changes with the sequence length in transformers, which a paged
# batch of mixed lengths cannot reproduce, so it is refused rather than run wrong.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# transformers' activation names -> ours.
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_GEMMA = ("gemma2", "gemma3_text")
_LAYER_TYPES = ("full_attention", "sliding_attention")


def read_model_fields(hf: Any, architecture: str | None = None) -> dict[str, Any]:
    """The `ModelConfig` fields of `hf`."""
    model_type = getattr(hf, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if architecture is None:
        archs = getattr(hf, "architectures", None) or []
        architecture = archs[0] if archs else DEFAULT_ARCHITECTURE[model_type]
    num_heads = int(hf.num_attention_heads)
    num_kv_heads = int(getattr(hf, "num_key_value_heads", None) or num_heads)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}"
        )
    head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // num_heads)
    num_layers = int(hf.num_hidden_layers)
    _refuse_attention_options(hf)
    rope, local_rope = _read_ropes(hf)
    return dict(
        architecture=architecture,
        model_type=model_type,
        vocab_size=int(hf.vocab_size),
        hidden_size=int(hf.hidden_size),
        intermediate_size=int(hf.intermediate_size),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.rms_norm_eps),
        rope=rope,
        local_rope=local_rope,
        rotary_dim=_rotary_dim(hf, head_dim),
        max_position_embeddings=int(hf.max_position_embeddings),
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        layer_windows=_read_windows(hf, model_type, num_layers),
        activation=_read_activation(hf, model_type),
        moe=_read_moe(hf, model_type, num_layers),
        bos_token_id=getattr(hf, "bos_token_id", None),
        eos_token_ids=_as_ids(getattr(hf, "eos_token_id", None)),
        **_family_options(hf, model_type),
    )


def _family_options(hf: Any, model_type: str) -> dict[str, Any]:
    """The options that follow from the family (biases, norms, scales)."""
    bias = bool(getattr(hf, "attention_bias", False))
    if model_type == "llama":
        return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": bool(getattr(hf, "mlp_bias", False))}
    if model_type in ("qwen2", "qwen2_moe"):  # q/k/v always carry a bias, o_proj never
        return {"qkv_bias": bool(getattr(hf, "qkv_bias", True))}
    if model_type in ("qwen3", "qwen3_moe"):
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True}
    if model_type in _GEMMA:
        return {
            "qkv_bias": bias,
            "o_bias": bias,
            "qk_norm": model_type == "gemma3_text",
            "norm_plus_one": True,
            "sandwich_norms": True,
            "embed_scale": float(hf.hidden_size) ** 0.5,
            "query_pre_attn_scalar": float(hf.query_pre_attn_scalar),
            "attn_logit_softcap": _float_or_none(getattr(hf, "attn_logit_softcapping", None)),
            "final_logit_softcap": _float_or_none(getattr(hf, "final_logit_softcapping", None)),
        }
    if model_type == "phi3":
        return {"fused_checkpoint": True}
    return {}  # mistral, mixtral


def _refuse_attention_options(hf: Any) -> None:
    if getattr(hf, "use_bidirectional_attention", None):
        raise ValueError("use_bidirectional_attention=True is not supported: attention here is causal")


def _read_activation(hf: Any, model_type: str) -> str:
    field = (
        "hidden_activation"
        if model_type in _GEMMA and getattr(hf, "hidden_activation", None)
        else "hidden_act"
    )
    act = getattr(hf, field, None) or "silu"
    if act not in ACTIVATIONS:
        raise ValueError(
            f"{field} {act!r} is not supported (supported: {', '.join(ACTIVATIONS)}): the MLP here is gated"
        )
    return ACTIVATIONS[act]


def _read_windows(hf: Any, model_type: str, num_layers: int) -> tuple[int | None, ...]:
    window = getattr(hf, "sliding_window", None)
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None:
        unknown = sorted(set(layer_types) - set(_LAYER_TYPES))
        if unknown:
            raise ValueError(
                f"layer_types {', '.join(map(repr, unknown))} are not supported "
                f"(supported: {', '.join(_LAYER_TYPES)})"
            )
        sliding = [t == "sliding_attention" for t in layer_types]
    elif model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):  # no layer_types: transformers' rules
        uses = bool(getattr(hf, "use_sliding_window", False))
        bound = int(getattr(hf, "max_window_layers", 0) or 0)
        if model_type == "qwen2_moe":
            sliding = [uses and i % 2 == 0 and i < bound for i in range(num_layers)]
        else:
            sliding = [uses and (model_type == "qwen3_moe" or i >= bound) for i in range(num_layers)]
    else:  # Mistral, Mixtral, Phi-3: one window over every layer
        sliding = [True] * num_layers
    if window is None or not any(sliding):
        return ()
    return tuple(int(window) if s else None for s in sliding)


def _read_moe(hf: Any, model_type: str, num_layers: int) -> MoEConfig | None:
    if model_type == "mixtral":
        return MoEConfig(
            num_experts=int(hf.num_local_experts),
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.intermediate_size),
            sparse_layers=(True,) * num_layers,
            renormalize=True,
            block_name="block_sparse_moe",
            expert_names=("w1", "w3", "w2"),
            experts_field="num_local_experts",
        )
    if model_type not in ("qwen2_moe", "qwen3_moe"):
        return None
    step = int(getattr(hf, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(hf, "mlp_only_layers", None) or ())
    num_experts = int(hf.num_experts)
    sparse = tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers))
    return MoEConfig(
        num_experts=num_experts,
        top_k=int(hf.num_experts_per_tok),
        intermediate_size=int(hf.moe_intermediate_size),
        sparse_layers=sparse,
        renormalize=bool(getattr(hf, "norm_topk_prob", False)),
        shared_expert_size=int(getattr(hf, "shared_expert_intermediate_size", 0) or 0),
    )


def _read_ropes(hf: Any) -> tuple[RopeConfig, RopeConfig | None]:
    """(the rope of full-attention layers, the windowed layers' own when they have one)."""
    params = getattr(hf, "rope_parameters", None)
    if params is None:  # transformers 4.x
        params = {
            "rope_theta": getattr(hf, "rope_theta", 10000.0),
            **(getattr(hf, "rope_scaling", None) or {}),
        }
    if params and all(isinstance(v, dict) for v in params.values()):  # per layer type (Gemma 3)
        unknown = sorted(set(params) - set(_LAYER_TYPES))
        if unknown:
            raise ValueError(f"rope_parameters for layer types {unknown} are not supported")
        full = _read_rope(hf, params.get("full_attention") or params["sliding_attention"])
        local = _read_rope(hf, params["sliding_attention"]) if "sliding_attention" in params else None
        return full, None if local == full else local
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError("rope_parameters mixes per-layer-type and global fields: not supported")
    return _read_rope(hf, params), None


def _read_rope(hf: Any, raw: dict[str, Any]) -> RopeConfig:
    params = dict(raw)
    theta = float(params.pop("rope_theta"))
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    params.pop("partial_rotary_factor", None)  # read by `_rotary_dim`
    if rope_type == "longrope":
        original = params.get("original_max_position_embeddings") or getattr(
            hf, "original_max_position_embeddings", None
        )
        if original is None:
            raise ValueError("rope_type 'longrope' needs original_max_position_embeddings")
        params["original_max_position_embeddings"] = int(original)
    return RopeConfig(theta=theta, type=rope_type, params=tuple(sorted(_hashable(params).items())))


def _rotary_dim(hf: Any, head_dim: int) -> int | None:
    params = getattr(hf, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    if factor is None:
        factor = getattr(hf, "partial_rotary_factor", None)
    if factor in (None, 1, 1.0):
        return None
    dim = int(head_dim * float(factor))
    if dim <= 0 or dim % 2 or not math.isfinite(float(factor)):
        raise ValueError(
            f"partial_rotary_factor={factor} gives {dim} rotated dims of {head_dim}: not supported"
        )
    return dim


def _hashable(params: dict[str, Any]) -> dict[str, RopeValue]:
    return {k: tuple(float(x) for x in v) if isinstance(v, list | tuple) else v for k, v in params.items()}


def _float_or_none(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _as_ids(value: int | list[int] | tuple[int, ...] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
