"""The fast load path of a converted model: config.json read without transformers' config
machinery (same ModelConfig as transformers' reading), the tokenizer.json run directly
(same tokenizer as AutoTokenizer's), and none of the heavy modules (transformers itself
included) imported by a chat request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixserve.model.config import ModelConfig, plain_hf_config
from radixserve.model.loader import LoadedModel, _read_hf_config

HEAVY_MODULES = (
    "transformers",  # not even for the chat template
    "torch.distributed.tensor",
    "transformers.modeling_utils",
    "transformers.configuration_utils",
    "transformers.models.auto.configuration_auto",
    "transformers.generation",
    "accelerate",
    "gguf",
)
PROBE = f"""
import asyncio, sys
from radixserve import AsyncEngine, EngineConfig, SamplingParams

async def main():
    engine = AsyncEngine(EngineConfig(model="smollm2-135m-instruct", device="cpu"))
    await engine.start()
    out = await engine.complete([{{"role": "user", "content": "hi"}}], SamplingParams(max_tokens=1))
    assert out.finished
    await engine.shutdown()

asyncio.run(main())
print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))
"""


def _from_transformers(folder: Path) -> ModelConfig:
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.from_pretrained(str(folder)))


def test_a_chat_request_on_the_embedded_model_imports_no_heavy_module(embedded: LoadedModel) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=Path.cwd()
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_embedded_config_and_tokenizer_equal_transformers_reading(embedded: LoadedModel) -> None:
    from transformers import AutoTokenizer

    assert embedded.path is not None
    folder = Path(embedded.path)
    assert plain_hf_config(json.loads((folder / "config.json").read_text())) is not None  # the fast path
    assert embedded.config == _from_transformers(folder)
    assert embedded.hf_config.model_type == "llama"  # read by transformers on demand
    ref = AutoTokenizer.from_pretrained(str(folder))
    ours = embedded.tokenizer
    assert type(ours.hf) is type(ref)  # transformers' tokenizer behind ours, loaded on demand
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo <|im_end|>"}]
    kw: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
    assert ours.apply_chat_template(chat, **kw) == ref.apply_chat_template(chat, **kw)
    for text in ("Hello, world!", "  spaces\tand\nnewlines ", "数学 émoji 🙂", "<|im_start|>user"):
        assert ours.encode(text) == ref(text)["input_ids"]
        assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text))
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id) == (
        ref.eos_token_id,
        ref.bos_token_id,
        ref.pad_token_id,
    )


def test_tiny_configs_read_as_transformers_reads_them(tmp_path: Path, helpers: Any) -> None:
    """Configs as transformers saves them (keys equal to a default may be left out, rope
    scaling): whichever path the loader takes, the ModelConfig is transformers'."""
    for kind in helpers.tiny_kinds:
        folder = tmp_path / kind
        helpers.make_tiny_checkpoint(kind, folder)
        read, _ = _read_hf_config(folder)
        assert ModelConfig.from_hf(read) == _from_transformers(folder), kind


@pytest.mark.parametrize("model_type", ("llama", "mistral", "qwen2", "qwen3"))
@pytest.mark.parametrize("rope_style", ("v4", "v5"))
def test_plain_config_json_equals_transformers(tmp_path: Path, model_type: str, rope_style: str) -> None:
    raw: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "tie_word_embeddings": model_type == "qwen2",
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "head_dim": 32,
        "sliding_window": 128,
        "use_sliding_window": False,
    }
    raw |= {"rope_theta": 5e5} if rope_style == "v4" else {"rope_parameters": {"rope_theta": 5e5}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    plain = plain_hf_config(raw)
    assert plain is not None
    assert ModelConfig.from_hf(plain) == _from_transformers(tmp_path)
    # Without a key whose default depends on the model type, transformers reads the file.
    del raw["rms_norm_eps"]
    assert plain_hf_config(raw) is None


def test_gate_up_rows_are_the_files_own_bytes(embedded: LoadedModel) -> None:
    """gate/up lie back to back in the file: the fused weight is a view of it, equal to its parts."""
    import torch
    from safetensors import safe_open

    assert embedded.path is not None
    path = Path(embedded.path) / "model.safetensors"
    layer = embedded.model.model.layers[3].mlp.gate_up_proj  # type: ignore[union-attr, index]
    with safe_open(str(path), framework="pt") as f:
        parts = [f.get_tensor(f"model.layers.3.mlp.{p}_proj.weight") for p in ("gate", "up")]
    assert torch.equal(layer.weight, torch.cat(parts))
    assert layer.weight.untyped_storage().nbytes() == path.stat().st_size  # mapped, not copied
