"""Tool parsers by name, and the name a chat template's family uses.

Add a format by subclassing `ToolParser` (markers, a `CallScanner`, `write_call`, `call_shape`,
`trigger`) and `register_tool_parser("name", MyParser)`; see docs/tools.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixserve.tools.base import ToolParser
from radixserve.tools.hermes import HermesParser
from radixserve.tools.llama import LlamaParser
from radixserve.tools.mistral import MistralParser
from radixserve.tools.types import FunctionSpec

_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen25": HermesParser,
    "qwen3": HermesParser,
    "llama3": LlamaParser,
    "llama32": LlamaParser,
    "mistral": MistralParser,
}


def tool_parser_names() -> tuple[str, ...]:
    return tuple(sorted(_PARSERS))


def tool_parser(name: str, tools: Sequence[FunctionSpec] = ()) -> ToolParser:
    """A parser of format `name`; with `tools`, only calls of those functions are calls."""
    cls = _PARSERS.get(name)
    if cls is None:
        raise ValueError(f"tool parser {name!r}: not one of {tool_parser_names()}")
    return cls(tools)


def register_tool_parser(name: str, cls: type[ToolParser], replace: bool = False) -> None:
    """Make `tool_parser(name)` build `cls`; a taken name needs `replace=True`."""
    if not name or not isinstance(name, str):
        raise ValueError("tool parser name: must be a non-empty string")
    if not (isinstance(cls, type) and issubclass(cls, ToolParser)):
        raise TypeError(f"tool parser {name!r}: {cls!r} is not a ToolParser subclass")
    if name in _PARSERS and not replace:
        raise ValueError(f"tool parser {name!r}: already registered (pass replace=True)")
    _PARSERS[name] = cls


def detect_tool_parser(chat_template: str) -> str | None:
    """The tool parser for a chat template, from the markup it renders tool calls with; None
    when it shows none of the known families."""
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or (
        "<|start_header_id|>" in chat_template and '"parameters": ' in chat_template
    ):
        return "llama3"
    return None
