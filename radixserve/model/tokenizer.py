"""Thin helpers over tokenizers: loading, chat prompts as ids, the EOS set.

A plain tokenizer.json loads as `TextTokenizer` (the `tokenizers` library, no
transformers import); any other folder as transformers' tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from radixserve.model.text_tokenizer import direct_tokenizer


class TokenizerLike(Protocol):
    """What the scheduler asks of a tokenizer (transformers' tokenizers and `TextTokenizer`
    both are one): ids of a text, and the text of ids."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# tokenizer_config.json classes that AutoTokenizer resolves to `PreTrainedTokenizerFast`
# itself (transformers 5 names it TokenizersBackend): loaded directly, skipping
# AutoTokenizer's reading of config.json, which imports transformers' model machinery.
GENERIC_FAST_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(folder: Path | str) -> Any | None:
    """The folder's tokenizer, or None when it has no tokenizer files."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    direct = direct_tokenizer(folder, GENERIC_FAST_CLASSES)
    if direct is not None:
        return direct
    if (folder / "tokenizer.json").is_file() and _tokenizer_class(folder) in GENERIC_FAST_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _tokenizer_class(folder: Path) -> str | None:
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


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
        # Read as transformers' GenerationConfig reads it, without importing its generation module.
        eos = json.loads((Path(folder) / "generation_config.json").read_text()).get("eos_token_id")
        if eos is not None:
            ids.update([int(eos)] if isinstance(eos, int) else (int(e) for e in eos))
    return frozenset(ids)
