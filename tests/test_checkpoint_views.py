"""`checkpoint_views` is the inverse of loading: transformers runs on exactly our weights."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from radixserve.model.loader import load_model
from radixserve.model.weights import checkpoint_views


def test_views_rebuild_the_transformers_model(tmp_path) -> None:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(cfg).eval().save_pretrained(tmp_path, safe_serialization=True)
    ours = load_model(str(tmp_path))
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    twin = AutoModelForCausalLM.from_config(ours.hf_config, dtype=torch.float32).eval()
    missing, unexpected = twin.load_state_dict(checkpoint_views(ours.model), strict=False)
    assert not unexpected and not missing
    ids = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        assert torch.equal(twin(ids).logits, ref(ids).logits)
