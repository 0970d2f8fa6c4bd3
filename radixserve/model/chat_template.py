"""A tokenizer's chat template rendered exactly as transformers 5's
`apply_chat_template(..., tokenize=False)` renders it, without importing transformers
(about 1 s of a 3 s cold start on a 2-core machine).

What transformers does (utils/chat_template_utils.py, tokenization_utils_base.py), and so
what this does:
- jinja2's `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the
  `loopcontrols` extension and a `{% generation %}` block tag (rendered as its body);
- the `tojson` filter as `json.dumps` (`ensure_ascii=False`, no HTML escaping; `indent`,
  `separators`, `sort_keys`), the globals `raise_exception` (a jinja2 `TemplateError`),
  `strftime_now`, `dict` (only call and `fromkeys`) and `namespace` (no `_` names);
- messages copied as plain data with the keys whose value is None dropped, reasoning
  under `reasoning_content` / `thinking` / `reasoning` copied to the names templates read;
- the variables `messages`, `tools`, `documents`, `add_generation_prompt`, the named
  special tokens (`bos_token`, `eos_token`, ...) and any extra keyword (which wins);
- `continue_final_message` (the final message left open).

`Unsupported` is raised (before anything is rendered) for what is not done here, and the
caller then asks transformers: tools given as Python functions (transformers derives their
JSON schema from the signature and docstring), batches of conversations, message objects
that are not plain dicts / lists / JSON scalars, `return_assistant_tokens_mask`,
`sanitize_control_tokens`, and tokenizing options other than `return_dict=False`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' order
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# apply_chat_template's own arguments with the value that this module renders by itself.
PLAIN_OPTIONS: dict[str, Any] = {
    "sanitize_control_tokens": False,
    "padding": False,
    "truncation": False,
    "max_length": None,
    "return_tensors": None,
    "return_assistant_tokens_mask": False,
    "tokenizer_kwargs": None,
}


class Unsupported(Exception):
    """A call this module does not render as transformers would: use transformers."""


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for transformers'
    assistant mask; without the mask it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in a template, without the type's own attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's `namespace()`, refusing underscore names (a way to reach CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(
            f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
            "Please rename the attribute."
        )


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (cached: a server renders the same one for every request)."""
    return _environment().from_string(source)


@lru_cache(maxsize=32)
def template_variables(source: str) -> frozenset[str]:
    """The variables `source` reads from its context (`messages`, `tools`, ...), as jinja2's
    `meta.find_undeclared_variables` finds them; a template that never reads `tools` has no
    tool support of its own."""
    import jinja2.meta

    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(source)))


def _plain(value: Any) -> Any:
    """A copy in plain JSON types; anything else is for transformers (it has rules for media,
    dataclasses, pydantic models, numpy scalars and enums)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if type(value) is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if type(value) is list:
        return [_plain(v) for v in value]
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    raise Unsupported(f"{type(value).__name__} in a chat template's input")


def _messages(conversation: Any) -> list[dict[str, Any]]:
    if not isinstance(conversation, list | tuple) or not conversation:
        raise Unsupported("not a list of messages")
    if any(isinstance(m, list | tuple) or not isinstance(m, dict) for m in conversation):
        raise Unsupported("a batch of conversations or message objects")
    chat = []
    for message in _plain(list(conversation)):
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def render(
    source: str,
    conversation: Any,
    special_tokens: Mapping[str, str],
    *,
    tools: Any = None,
    documents: Any = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    **kwargs: Any,
) -> str:
    """`source` rendered over one conversation, as `apply_chat_template(tokenize=False)`
    of a tokenizer whose named special tokens are `special_tokens`."""
    if tools is not None and any(not isinstance(t, dict) for t in tools):
        raise Unsupported("tools given as functions")
    chat = _messages(conversation)
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message "
            "when you want the model to continue the final message, and add_generation_prompt when you want "
            "to add a header that will prompt it to start a new assistant message instead."
        )
    if documents is not None and any(not isinstance(d, dict) for d in documents):
        raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    template = compile_template(source)
    variables = _plain({**special_tokens, **kwargs})
    final = _open_final_message(source, chat, continue_final_message) if continue_final_message else None
    text = template.render(
        messages=chat,
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    return text if final is None else _cut_at_tag(text, final)


def _open_final_message(source: str, chat: list[dict[str, Any]], field: bool | str) -> str:
    """Tag the final message's text so the render can be cut right after it; returns that text."""
    key = field if isinstance(field, str) else "content"
    final = chat[-1].get(key)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{key}" to continue!')
    keys = [key] if key not in REASONING_FIELDS else [f for f in REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(k in source for k in keys):
        raise ValueError(
            f'continue_final_message is set to "{key}" but this is not an accepted field in the chat_template'
        )
    if isinstance(final, list | tuple):
        for block in reversed(final):
            if "text" in block:
                final, block["text"] = block["text"], block["text"] + CONTINUE_TAG
                return str(final)
        raise ValueError(
            "continue_final_message is set but we could not find any text to continue in the final message!"
        )
    for k in keys:
        chat[-1][k] = chat[-1][k] + CONTINUE_TAG
    return str(final)


def _cut_at_tag(text: str, final: str) -> str:
    if final.strip() not in text or CONTINUE_TAG.strip() not in text:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the chat after "
            "applying the chat template (the template deletes portions of it). "
            f"Final message to continue: {final.strip()}\nRendered chat:\n{text}"
        )
    at = text.rindex(CONTINUE_TAG.strip())
    # A template that keeps the tag's trailing space kept the message's spacing too.
    return text[:at] if text[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()


def apply(
    source: str,
    special_tokens: Mapping[str, str],
    encode: Any,
    conversation: Any,
    *,
    tokenize: bool = True,
    return_dict: bool = True,
    **kwargs: Any,
) -> str | list[int]:
    """`apply_chat_template(conversation, ...)` for the calls rendered here (`Unsupported`
    otherwise): the text, or with `tokenize=True, return_dict=False` its ids from
    `encode(text)` (no special tokens added: the template writes them)."""
    for name, default in PLAIN_OPTIONS.items():
        if kwargs.pop(name, default) != default:
            raise Unsupported(f"{name} in apply_chat_template")
    if kwargs.get("chat_template") is not None:
        source = kwargs.pop("chat_template")
    kwargs.pop("chat_template", None)
    if tokenize and return_dict:
        raise Unsupported("a BatchEncoding result")
    if isinstance(conversation, list | tuple) and not conversation:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    text = render(source, conversation, special_tokens, **kwargs)
    return list(encode(text)) if tokenize else text
