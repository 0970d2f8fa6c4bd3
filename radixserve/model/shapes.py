"""Named model shapes: published config.json contents, for dummy-weight runs without files.

Throughput does not depend on the weights' values when generation ignores
EOS, so `load_model("dummy:llama-3.1-8b")` benchmarks an 8B model on a
machine that has no checkpoint. The dicts are the fields of each model's
published config.json that define its computation (written as published, in
the transformers 4 style; transformers 5 converts `rope_theta`/`rope_scaling`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

_LLAMA_COMMON: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}

_QWEN2_COMMON: dict[str, Any] = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}

SHAPES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # HuggingFaceTB/SmolLM2-135M-Instruct
        "smollm2-135m": {
            **_LLAMA_COMMON,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "vocab_size": 49152,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
        },
        # meta-llama/Llama-3.2-1B
        "llama-3.2-1b": {
            **_LLAMA_COMMON,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "tie_word_embeddings": True,
            "bos_token_id": 128000,
            "eos_token_id": 128001,
        },
        # meta-llama/Llama-3.1-8B
        "llama-3.1-8b": {
            **_LLAMA_COMMON,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "tie_word_embeddings": False,
            "bos_token_id": 128000,
            "eos_token_id": 128001,
        },
        # mistralai/Mistral-7B-v0.3 (no sliding window)
        "mistral-7b": {
            "model_type": "mistral",
            "architectures": ["MistralForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 32768,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        # Qwen/Qwen2.5-0.5B
        "qwen2.5-0.5b": {
            **_QWEN2_COMMON,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "sliding_window": 32768,
            "max_window_layers": 24,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        },
        # Qwen/Qwen2.5-7B
        "qwen2.5-7b": {
            **_QWEN2_COMMON,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "max_position_embeddings": 131072,
            "sliding_window": 131072,
            "max_window_layers": 28,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
        },
        # Qwen/Qwen3-0.6B
        "qwen3-0.6b": {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "attention_bias": False,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 28,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
        # Qwen/Qwen3-30B-A3B: 128 experts of 768, 8 per token, every layer sparse
        "qwen3-30b-a3b": {
            "model_type": "qwen3_moe",
            "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "attention_bias": False,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 48,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
        # mistralai/Mixtral-8x7B-v0.1: 8 experts of 14336, 2 per token
        "mixtral-8x7b": {
            "model_type": "mixtral",
            "architectures": ["MixtralForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "sliding_window": None,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        # google/gemma-2-9b: windows of 4096 on alternate layers, soft-capped logits
        "gemma-2-9b": {
            "model_type": "gemma2",
            "architectures": ["Gemma2ForCausalLM"],
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 3584,
            "intermediate_size": 14336,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "vocab_size": 256000,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
        },
        # google/gemma-3-12b-it's text_config: five windowed layers (1024) per global one
        "gemma-3-12b": {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 3840,
            "intermediate_size": 15360,
            "num_hidden_layers": 48,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "vocab_size": 262208,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            "tie_word_embeddings": True,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
        },
        # microsoft/Phi-4-mini-instruct: fused qkv and gate_up, 3/4 of each head rotated, long-rope.
        # The 48 rope factors here are placeholders of the published length (a step's cost does not
        # depend on their values).
        "phi-4-mini": {
            "model_type": "phi3",
            "architectures": ["Phi3ForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 32,
            "num_attention_heads": 24,
            "num_key_value_heads": 8,
            "vocab_size": 200064,
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0] * 48,
                "long_factor": [1.0 + i / 8 for i in range(48)],
            },
            "rms_norm_eps": 1e-5,
            "sliding_window": 262144,
            "tie_word_embeddings": True,
            "bos_token_id": 199999,
            "eos_token_id": 199999,
            "pad_token_id": 199999,
        },
    }
)


def shape_names() -> list[str]:
    return sorted(SHAPES)


def shape_hf_config(name: str) -> Any:
    """The transformers config object of a named shape."""
    if name not in SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known shapes: {', '.join(shape_names())}")
    from transformers import AutoConfig

    fields = copy.deepcopy(dict(SHAPES[name]))  # transformers may edit nested dicts in place
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)
