"""Thin helpers over transformers tokenizers: loading, chat prompts as ids, the EOS set."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(folder: Path | str) -> Any | None:
    """The folder's tokenizer, or None when it has no tokenizer files."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def chat_prompt_ids(
    tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template."""
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    # The template writes the special tokens (BOS included) itself.
    return list(tokenizer.encode(text, add_special_tokens=False))


def eos_token_ids(
    config_eos: Sequence[int], tokenizer: Any | None, folder: Path | str | None
) -> frozenset[int]:
    """Every id that ends generation: the config's, the tokenizer's and generation_config.json's."""
    ids = set(config_eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if folder is not None and (Path(folder) / "generation_config.json").is_file():
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(folder)).eos_token_id
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    return frozenset(ids)
