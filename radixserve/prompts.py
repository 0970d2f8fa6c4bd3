"""A prompt as the caller gives it (text, chat messages or token ids) to token ids.

One function for every entry point (the engine, the HTTP routes), so they
accept and reject the same prompts with the same `ValueError` / `TypeError`.

Chat messages go through the tokenizer's chat template with the OpenAI-style
`tools`, tool turns and `chat_template_kwargs` as transformers' `apply_chat_template`
takes them (`radixserve.chat_input` checks and reshapes them); a template with no
tool support of its own gets the default Hermes tool prompt
(`radixserve.model.tool_prompt`), so tools are never dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixserve import chat_input
from radixserve import validation as V

# A JSON object as `json.loads` gives it (chat messages, OpenAI tools): its values are any JSON,
# checked where they are read (chat_input.py), so `Any` is the honest type of a value.
JsonObject = dict[str, Any]
Prompt = str | Sequence[JsonObject] | Sequence[int]


def is_chat(prompt: Any) -> bool:
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and bool(prompt)
        and (isinstance(prompt[0], Mapping))
    )


def tokenize_prompt(
    tokenizer: Any,
    prompt: Any,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of `prompt`: text (with the tokenizer's special tokens), chat messages
    (through its chat template, see `render_chat`) or token ids (numpy/torch arrays too).
    `tools` and `chat_template_kwargs` are for chat messages only."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids instead of text")
        _no_chat_options(tools, chat_template_kwargs)
        V.check_text("prompt", prompt, owner="the")
        return encode_text(tokenizer, prompt, add_special_tokens=True)
    if hasattr(prompt, "tolist") and not isinstance(prompt, (bytes, bytearray)):
        prompt = prompt.tolist()  # a numpy array or torch tensor of ids
    if not isinstance(prompt, Sequence) or isinstance(prompt, (bytes, bytearray)):
        raise TypeError(
            "a prompt is a string, a list of chat messages (dicts) or a list of token ids, "
            f"got {type(prompt).__name__}"
        )
    seq = list(prompt)
    if is_chat(seq):
        text = render_chat(tokenizer, seq, tools=tools, chat_template_kwargs=chat_template_kwargs)
        return encode_text(tokenizer, text, add_special_tokens=False)
    _no_chat_options(tools, chat_template_kwargs)
    return V.prompt_token_ids(seq)


def render_chat(
    tokenizer: Any,
    messages: Sequence[Any],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of `messages` (OpenAI's shape: assistant `tool_calls` with JSON-string
    arguments, `tool` messages with `tool_call_id`) with `tools` (OpenAI's function list),
    as `apply_chat_template(messages, tools=tools, tokenize=False, **chat_template_kwargs)`
    renders it after the arguments are parsed to dicts. A `ValueError` names a bad field
    (`messages[3].tool_call_id`) or carries the template's own error."""
    from radixserve.model.tool_prompt import needs_default_tool_prompt, with_default_tool_prompt

    source = template_source(tokenizer)
    if source is None:
        raise ValueError("this model has no chat template: pass text or token ids")
    chat = chat_input.chat_messages(messages)
    specs = chat_input.chat_tools(tools)
    extra = chat_input.template_kwargs(chat_template_kwargs)
    if needs_default_tool_prompt(source, chat, specs):
        chat, specs = with_default_tool_prompt(chat, specs), None
    try:
        text = tokenizer.apply_chat_template(
            chat, tools=specs, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
    except Exception as e:  # noqa: BLE001 - e.g. a template that requires alternating roles
        raise ValueError(f"the chat template rejected these messages: {e}") from e
    return str(text)


def template_source(tokenizer: Any) -> str | None:
    """The template `apply_chat_template` renders with tools: transformers' named templates
    (a dict) pick "tool_use" when there is one, else "default"."""
    source = None if tokenizer is None else getattr(tokenizer, "chat_template", None)
    if isinstance(source, Mapping):
        source = source.get("tool_use") or source.get("default")
    return source if isinstance(source, str) and source else None


def _no_chat_options(tools: Any, chat_template_kwargs: Any) -> None:
    if tools is not None or chat_template_kwargs is not None:
        raise ValueError("tools and chat_template_kwargs apply to chat messages, not to text or token ids")


def encode_text(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except Exception as e:  # noqa: BLE001 - the tokenizer's failure on this input
        raise ValueError(f"the tokenizer failed on this prompt: {type(e).__name__}: {e}") from e
