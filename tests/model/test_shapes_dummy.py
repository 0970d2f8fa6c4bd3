"""Named shapes build with their published sizes; dummy weights are deterministic and sane."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.model.config import ModelConfig
from radixserve.model.layers import RotaryEmbedding
from radixserve.model.loader import load_model
from radixserve.model.registry import resolve_architecture
from radixserve.model.shapes import SHAPES, shape_hf_config

# Published parameter counts (model cards / safetensors metadata).
PUBLISHED = {
    "smollm2-135m": 134.5e6,
    "llama-3.2-1b": 1.24e9,
    "llama-3.1-8b": 8.03e9,
    "mistral-7b": 7.25e9,
    "qwen2.5-0.5b": 0.494e9,
    "qwen2.5-7b": 7.62e9,
    "qwen3-0.6b": 0.596e9,
    "qwen3-30b-a3b": 30.5e9,
    "mixtral-8x7b": 46.7e9,
    "gemma-2-9b": 9.24e9,
    "gemma-3-12b": 11.77e9,  # the text model of the published 12.2B (without its 0.42B vision encoder)
    "phi-4-mini": 3.84e9,
}


def test_required_shapes_exist() -> None:
    assert {"smollm2-135m", "qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "llama-3.1-8b"} <= set(SHAPES)
    assert set(SHAPES) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shape_builds_with_published_parameter_count(name: str) -> None:
    from transformers import AutoModelForCausalLM

    hf_config = shape_hf_config(name)
    _, cls = resolve_architecture(hf_config.architectures)
    config = ModelConfig.from_hf(hf_config)
    with torch.device("meta"):
        ours = cls(config, dtype=torch.bfloat16)
        ref = AutoModelForCausalLM.from_config(hf_config)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in ref.parameters())
    assert abs(count / PUBLISHED[name] - 1) < 0.02, f"{name}: {count / 1e9:.3f}B"


def test_llama31_rope_matches_transformers_at_full_size() -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_config = shape_hf_config("llama-3.1-8b")
    cfg = ModelConfig.from_hf(hf_config)
    ours = RotaryEmbedding(
        cfg.rope, cfg.head_dim, cfg.hidden_size, cfg.num_heads, cfg.max_position_embeddings
    )
    positions = torch.tensor([0, 1, 100, 8191, 8192, 65536, 131071])
    cos, sin = LlamaRotaryEmbedding(hf_config)(torch.zeros(1, dtype=torch.float32), positions[None])
    half = cfg.head_dim // 2
    assert torch.equal(ours.cos[positions], cos[0, :, :half]) and torch.equal(
        ours.sin[positions], sin[0, :, half:]
    )


def test_dummy_forward_is_deterministic_and_sane(helpers: Any) -> None:
    first = load_model("dummy:smollm2-135m")
    second = load_model("smollm2-135m", load_format="dummy")
    assert first.path is None and first.config.num_layers == 30
    assert first.tokenizer is not None  # the embedded model's, same vocabulary
    for (name, a), (_, b) in zip(
        first.model.named_parameters(), second.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    ids = list(range(10, 40))
    logits = helpers.our_logits(first.model, first.config, ids, torch.arange(len(ids)))
    again = helpers.our_logits(second.model, second.config, ids, torch.arange(len(ids)))
    assert torch.equal(logits, again)
    assert torch.isfinite(logits).all() and 0.01 < logits.std().item() < 10.0
    # Norm weights are one, the rest is small and random.
    model = first.model.model
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    assert abs(model.layers[0].mlp.down_proj.weight.std().item() - 0.02) < 0.002


def test_dummy_format_on_a_folder_keeps_config_and_drops_weights(tmp_path: Path, helpers: Any) -> None:
    hf = helpers.make_tiny_checkpoint("qwen3", tmp_path)
    dummy = load_model(str(tmp_path), load_format="dummy")
    assert dummy.path is None and dummy.config.qk_norm and dummy.config.head_dim == 32
    real = hf.model.embed_tokens.weight
    assert not torch.equal(dummy.model.model.embed_tokens.weight, real)


def test_dummy_in_half_precision() -> None:
    loaded = load_model("dummy:qwen2.5-0.5b", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.tokenizer is None and loaded.config.qkv_bias and loaded.config.tie_word_embeddings


def test_dummy_gemma_does_not_just_repeat_its_input(tmp_path: Path, helpers: Any) -> None:
    """Gemma scales embeddings by sqrt(hidden) and ties lm_head to them: dummy embeddings of
    the usual std made the last input token's own logit lead by many nats, so a dummy Gemma
    repeated its input and the GPU suite's agreement figures said nothing. Dummy embeddings
    of such models are drawn smaller (weights.init_dummy_weights)."""
    from transformers import Gemma2Config

    Gemma2Config(
        vocab_size=512,
        hidden_size=1024,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
    ).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), load_format="dummy")
    assert loaded.config.embed_scale == pytest.approx(32.0) and loaded.config.tie_word_embeddings
    gen = torch.Generator().manual_seed(0)
    repeats = 0
    for _ in range(8):
        ids = torch.randint(0, 512, (12,), generator=gen).tolist()
        logits = helpers.our_logits(loaded.model, loaded.config, ids, torch.arange(len(ids)))
        assert torch.isfinite(logits).all()
        repeats += int(logits[-1].argmax()) == ids[-1]
    assert repeats <= 2, repeats


def test_rotary_tables_stay_float32_and_dense_in_a_bf16_model() -> None:
    """The fused rope + K/V store (runtime/attention/kv_store.py) takes float32 tables with
    dense rows; a bf16 model that cast them would fall back to a separate rope every layer."""
    model = load_model("dummy:smollm2-135m", dtype=torch.bfloat16).model
    rope = model.model.rotary_emb.rope
    for table in (rope.cos, rope.sin):
        assert table.dtype == torch.float32 and table.stride(-1) == 1
    assert next(model.parameters()).dtype == torch.bfloat16
