"""Chat messages, tools and template keywords checked at the boundary and put in the
shape chat templates read.

What a caller hands in is OpenAI's shape; what templates receive is what
transformers' `apply_chat_template(messages, tools=...)` documents (and vLLM passes):

- `tools`: `[{"type": "function", "function": {"name", "description", "parameters"}}]`,
  passed through unchanged (copied);
- an assistant message may carry `tool_calls`
  (`[{"id", "type": "function", "function": {"name", "arguments"}}]`) with or without
  `content` (a missing or null one is passed as "", as vLLM does: templates concatenate
  it); `arguments` is a JSON *string* in OpenAI's API, and templates iterate it as a
  mapping (`arguments | items`, `arguments | tojson`), so it is parsed to a dict;
- a `tool` message carries `tool_call_id`, the id of a call made earlier in the
  conversation, and the result as `content`;
- `chat_template_kwargs` are extra template variables (e.g. Qwen3's `enable_thinking`).

Every error is a `ValueError` naming the field: `messages[3].tool_call_id`,
`tools[0].function.parameters`, `chat_template_kwargs.tools`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from radixserve.tools.types import function_specs
from radixserve.validation import CHAT_ROLES, check_text

ToolSpec = dict[str, Any]
# Template variables that apply_chat_template sets itself or reads as its own arguments.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "tokenize",
        "return_dict",
        "return_tensors",
        "padding",
        "truncation",
        "max_length",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{field}={_short(value)}: {why}")


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(field, value, "must be a non-empty string")
    check_text(field, value, owner="chat")
    return value


def _plain_json(field: str, value: Any) -> None:
    """JSON-encodable (templates `tojson` it) and so also free of cycles and odd objects."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise _bad(field, value, f"must be JSON data ({e})") from None


def chat_tools(tools: Any) -> list[ToolSpec] | None:
    """`tools` checked (`radixserve.tools.function_specs`: names, JSON schemas), as copies;
    None and an empty list mean no tools."""
    if tools is None or (isinstance(tools, Sequence) and not isinstance(tools, str | bytes) and not tools):
        return None
    function_specs(tools)
    _plain_json("tools", list(tools))
    return [json.loads(json.dumps(dict(tool))) for tool in tools]


def _arguments(field: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise _bad(field, value, f"is not valid JSON ({e})") from None
    if not isinstance(value, Mapping):
        raise _bad(field, value, "must be a JSON object (a string in OpenAI's API, or a dict)")
    _plain_json(field, dict(value))
    return dict(value)


def _tool_calls(at: str, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes, bytearray)) or not calls:
        raise _bad(f"{at}.tool_calls", calls, "must be a non-empty list of tool calls")
    out = []
    for j, call in enumerate(calls):
        here = f"{at}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise _bad(here, call, "must be a dict {'id', 'type': 'function', 'function': {...}}")
        _name(f"{here}.id", call.get("id"))
        if call.get("type", "function") != "function":
            raise _bad(f"{here}.type", call.get("type"), "must be 'function'")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise _bad(f"{here}.function", fn, "must be a dict with 'name' and 'arguments'")
        _name(f"{here}.function.name", fn.get("name"))
        args = _arguments(f"{here}.function.arguments", fn.get("arguments", {}))
        out.append({**call, "type": "function", "function": {**fn, "arguments": args}})
    return out


def chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The messages checked and in the templates' shape (see the module docstring)."""
    out: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise ValueError(f"{at} must be a dict with 'role' and 'content', got {_short(m)}")
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise _bad(f"{at}.role", role, f"must be one of {', '.join(CHAT_ROLES)}")
        message = {k: v for k, v in m.items() if v is not None}
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise _bad(f"{at}.tool_calls", calls, "only assistant messages carry tool calls")
            message["tool_calls"] = _tool_calls(at, calls)
            message.setdefault("content", "")  # as vLLM passes it: templates read it as a string
            call_ids.update(c["id"] for c in message["tool_calls"])
        if not isinstance(content, str) and not (content is None and calls is not None):
            raise _bad(f"{at}.content", content, "must be a string")
        if content is not None:
            check_text("content", content, owner=at)
        if role == "tool":
            call_id = _name(f"{at}.tool_call_id", m.get("tool_call_id"))
            if call_id not in call_ids:
                why = "answers no tool call of an earlier assistant message"
                raise _bad(f"{at}.tool_call_id", call_id, why)
        elif m.get("tool_call_id") is not None:
            raise _bad(f"{at}.tool_call_id", m["tool_call_id"], "only tool messages carry a tool_call_id")
        out.append(message)
    return out


def template_kwargs(kwargs: Any) -> dict[str, Any]:
    """`chat_template_kwargs`: extra template variables with string names, as JSON data."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise _bad("chat_template_kwargs", kwargs, "must be a dict of template variables")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise _bad("chat_template_kwargs", key, "names must be identifiers")
        if key in RESERVED_TEMPLATE_KWARGS:
            why = "is set by radixserve, not a template variable"
            raise _bad(f"chat_template_kwargs.{key}", kwargs[key], why)
        _plain_json(f"chat_template_kwargs.{key}", kwargs[key])
    return dict(kwargs)
