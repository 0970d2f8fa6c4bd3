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


def test_sliding_window_caps_the_context() -> None:
    """Full attention equals sliding-window attention while no sequence is longer than
    the window, so a windowed model runs exactly with its context capped there."""
    from transformers import MistralConfig, Qwen2Config

    assert ModelConfig.from_hf(MistralConfig(**_SMALL, sliding_window=100)).max_context_len == 100
    assert ModelConfig.from_hf(MistralConfig(**_SMALL, sliding_window=None)).max_context_len == 512
    # Qwen2 carries a window that no layer uses unless use_sliding_window is set.
    unused = Qwen2Config(**_SMALL, sliding_window=64, use_sliding_window=False)
    assert ModelConfig.from_hf(unused).max_context_len == 512
    used = Qwen2Config(**_SMALL, sliding_window=64, use_sliding_window=True, max_window_layers=1)
    assert ModelConfig.from_hf(used).max_context_len == 64


def test_sliding_window_model_matches_transformers_inside_the_window(tmp_path: Any, helpers: Any) -> None:
    from transformers import AutoModelForCausalLM, MistralConfig

    from radixserve.model.loader import load_model

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(MistralConfig(**_SMALL, sliding_window=24)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_model(str(tmp_path))
    assert ours.config.max_context_len == 24
    ids = torch.randint(3, 256, (24,)).tolist()
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    assert helpers.rel_err(helpers.our_logits(ours.model, ours.config, ids, torch.arange(24)), ref) < 1e-4
    # Past the window transformers masks old tokens and full attention would differ:
    # the reason the context is capped rather than the window ignored.
    longer = torch.randint(3, 256, (40,)).tolist()
    with torch.inference_mode():
        ref = hf(torch.tensor([longer])).logits[0, -1]
    assert helpers.rel_err(helpers.our_logits(ours.model, ours.config, longer, None)[0], ref) > 1e-3


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
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
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
