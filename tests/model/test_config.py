"""`ModelConfig.from_hf`: options per model type, sliding windows, rope, refusals."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radixserve.model.config import ModelConfig, RopeConfig

_SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def test_kv_pool_config_and_derived_sizes() -> None:
    from transformers import Qwen3Config

    cfg = ModelConfig.from_hf(Qwen3Config(**_SMALL, head_dim=32))
    pool = cfg.kv_pool_config(torch.bfloat16, "cpu")
    assert (pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype, pool.device) == (
        3,
        2,
        32,
        torch.bfloat16,
        "cpu",
    )
    assert (cfg.q_size, cfg.kv_size, cfg.attn_scale) == (128, 64, 32**-0.5)
    assert cfg.architecture == "Qwen3ForCausalLM" and cfg.qk_norm and not cfg.qkv_bias


def test_sliding_windows_are_read_per_layer() -> None:
    """A window is a per-layer mask: the context stays the model's whole length."""
    from transformers import MistralConfig, Qwen2Config

    every = ModelConfig.from_hf(MistralConfig(**_SMALL, sliding_window=100))
    assert every.layer_windows == (100, 100, 100) and every.max_context_len == 512
    assert every.attention_options().min_window == 100
    assert ModelConfig.from_hf(MistralConfig(**_SMALL, sliding_window=None)).layer_windows == ()
    # Qwen2 carries a window that no layer uses unless use_sliding_window is set.
    unused = Qwen2Config(**_SMALL, sliding_window=64, use_sliding_window=False)
    assert ModelConfig.from_hf(unused).layer_windows == ()
    used = Qwen2Config(**_SMALL, sliding_window=64, use_sliding_window=True, max_window_layers=1)
    assert ModelConfig.from_hf(used).layer_windows == (None, 64, 64)


def test_sliding_window_model_matches_transformers_past_the_window(tmp_path: Any, helpers: Any) -> None:
    from transformers import AutoModelForCausalLM, MistralConfig

    from radixserve.model.loader import load_model

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(MistralConfig(**_SMALL, sliding_window=24)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_model(str(tmp_path))
    assert ours.config.max_context_len == 512
    # 40 tokens: the last 16 no longer see the first ones.
    ids = torch.randint(3, 256, (40,)).tolist()
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    assert helpers.rel_err(helpers.our_logits(ours.model, ours.config, ids, torch.arange(40)), ref) < 1e-4


def test_transformers4_style_rope_fields() -> None:
    old = SimpleNamespace(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        **_SMALL,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={"type": "linear", "factor": 2.0},
        eos_token_id=[1, 2],
    )
    cfg = ModelConfig.from_hf(old)
    assert cfg.rope == RopeConfig(theta=500000.0, type="linear", params=(("factor", 2.0),))
    assert cfg.eos_token_ids == (1, 2) and cfg.head_dim == 16


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"hidden_act": "gelu"}, "gelu"),
        ({"model_type": "gpt2"}, "gpt2"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "layer_types"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"partial_rotary_factor": 0.1}, "partial_rotary_factor=0.1"),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}}, "original_max_position"),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], needle: str) -> None:
    fields = {
        "model_type": "llama",
        **_SMALL,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e4,
        "rope_scaling": None,
        "hidden_act": "silu",
    }
    fields.update(change)
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf(SimpleNamespace(**fields))
    assert needle in str(err.value)
