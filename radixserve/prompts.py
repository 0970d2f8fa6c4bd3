"""A prompt as the caller gives it (text, chat messages or token ids) to token ids.

One function for every entry point (the engine, the HTTP routes), so they
accept and reject the same prompts with the same `ValueError` / `TypeError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixserve import validation as V

Prompt = str | Sequence[dict[str, Any]] | Sequence[int]


def is_chat(prompt: Any) -> bool:
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and bool(prompt)
        and (isinstance(prompt[0], Mapping))
    )


def tokenize_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """Token ids of `prompt`: text (with the tokenizer's special tokens), chat messages
    (through its chat template) or token ids (numpy/torch arrays too)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids instead of text")
        V.check_text("prompt", prompt, owner="the")
        return _encode(tokenizer, prompt, add_special_tokens=True)
    if hasattr(prompt, "tolist") and not isinstance(prompt, (bytes, bytearray)):
        prompt = prompt.tolist()  # a numpy array or torch tensor of ids
    if not isinstance(prompt, Sequence) or isinstance(prompt, (bytes, bytearray)):
        raise TypeError(
            "a prompt is a string, a list of chat messages (dicts) or a list of token ids, "
            f"got {type(prompt).__name__}"
        )
    seq = list(prompt)
    if is_chat(seq):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template: pass text or token ids")
        messages = V.chat_messages(seq)
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - e.g. a template that requires alternating roles
            raise ValueError(f"the chat template rejected these messages: {e}") from e
        return _encode(tokenizer, text, add_special_tokens=False)
    return V.prompt_token_ids(seq)


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except Exception as e:  # noqa: BLE001 - the tokenizer's failure on this input
        raise ValueError(f"the tokenizer failed on this prompt: {type(e).__name__}: {e}") from e
