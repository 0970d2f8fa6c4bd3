"""The default tool prompt, for chat templates that have no tool support of their own.

A template that never reads the `tools` variable (the embedded SmolLM2's, most
pre-2024 templates) would drop the tools without a word. Instead, before such a
template renders, the conversation is rewritten in the Hermes format (the one
Qwen2.5's and NousResearch's Hermes templates use, which the Hermes tool-call
parser reads back):

- the tools go into the system message, after its text (a system message is
  added first when there is none): a `# Tools` header, each tool as one line of
  JSON inside `<tools></tools>`, and the instruction to answer with
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- an assistant message's `tool_calls` become that text after its content;
- `tool` messages become one `user` message of `<tool_response>...</tool_response>`
  blocks per run of consecutive results (templates that require alternating
  user/assistant roles accept it).

`needs_default_tool_prompt(source, ...)` says when: the template does not read
`tools`, and the call has tools or tool turns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from radixserve.model.chat_template import template_variables

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def has_tool_turns(messages: Sequence[dict[str, Any]]) -> bool:
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def needs_default_tool_prompt(
    source: str, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> bool:
    """True when `source` ignores `tools` and the call has tools or tool turns to show."""
    return bool(tools or has_tool_turns(messages)) and "tools" not in template_variables(source)


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """The `# Tools` text of the system message."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def call_text(call: dict[str, Any]) -> str:
    """One tool call as the model is asked to write it."""
    fn = call["function"]
    body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def with_default_tool_prompt(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The conversation rewritten in the Hermes format (see the module docstring); checked
    messages in (`radixserve.chat_input.chat_messages`), plain role/content messages out."""
    out: list[dict[str, Any]] = []
    after_result = False  # the previous message was a tool result: join this one to it
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if after_result:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_result = True
            continue
        after_result = False
        if m.get("tool_calls"):
            texts = ([m["content"]] if m.get("content") else []) + [call_text(c) for c in m["tool_calls"]]
            rest = {k: v for k, v in m.items() if k not in ("tool_calls", "content")}
            out.append({**rest, "content": "\n".join(texts)})
        else:
            out.append(dict(m))
    if tools:
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{tools_block(tools)}"
        else:
            out.insert(0, {"role": "system", "content": tools_block(tools)})
    return out
