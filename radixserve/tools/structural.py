"""xgrammar structural tags for tool calls (the JSON form `{"type": "structural_tag", "format":
...}` that `xgr.Grammar.from_structural_tag` and `xgr.GrammarCompiler.compile_structural_tag` take).

Three modes, as OpenAI's `tool_choice`:

- "auto": free text; after the format's trigger (`<tool_call>`) the output must be a complete
  call of one of the tools (the triggered tags of xgrammar); `parallel=False` ends the output
  after the first call.
- "required": only calls, at least one, separated by the format's separator (one with
  `parallel=False`).
- "named": as "required", with the one function named.

Under "required" and "named", and for a strict function under "auto", arguments follow the
function's `parameters` (rewritten by `constrained.json_schema.prepare` as every schema the
engine compiles), so forced calls always validate; a non-strict function's arguments under
"auto" are any JSON object, as OpenAI treats non-strict schemas as a hint there.
Whitespace inside arguments is at most one character in a
row: a small model otherwise can pad JSON with whitespace until max_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from radixserve.constrained.json_schema import prepare
from radixserve.tools.types import FunctionSpec

Mode = Literal["auto", "required", "named"]
MODES: tuple[Mode, ...] = ("auto", "required", "named")
MAX_WHITESPACE = 1
Fmt = dict[str, object]


@dataclass(frozen=True)
class CallShape:
    """How a format writes one call: `begin(name)`, the arguments object, then `end`."""

    begin_prefix: str  # before the name
    begin_suffix: str  # after the name, up to the arguments
    end: str


def arguments_format(spec: FunctionSpec, follow_schema: bool) -> Fmt:
    # A schema without a type describes the arguments object all the same (`function_spec`
    # refuses other types): without the type, xgrammar would let a forced call write any value.
    schema: dict[str, object] = (
        prepare({"type": "object", **spec.parameters}) if follow_schema else {"type": "object"}
    )
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE}


def call_tag(shape: CallShape, spec: FunctionSpec, mode: str) -> Fmt:
    return {
        "type": "tag",
        "begin": shape.begin_prefix + spec.name + shape.begin_suffix,
        "content": arguments_format(spec, spec.strict or mode != "auto"),
        "end": shape.end,
    }


def chosen(tools: Sequence[FunctionSpec], mode: str, function: str | None) -> tuple[FunctionSpec, ...]:
    """The functions a mode allows; checks the arguments of `structural_tag`."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: must be one of {MODES}")
    if not tools:
        raise ValueError("tools: a structural tag needs at least one function")
    if mode != "named":
        if function is not None:
            raise ValueError(f"function={function!r}: only for mode 'named'")
        return tuple(tools)
    named = tuple(t for t in tools if t.name == function)
    if not named:
        raise ValueError(f"function={function!r}: not one of the tools {[t.name for t in tools]}")
    return named


def calls_format(
    tags: list[Fmt], trigger: str, separator: str, mode: str, parallel: bool
) -> Fmt:
    """The format of the calls, for tags that each hold one call."""
    if mode == "auto":
        return {
            "type": "triggered_tags",
            "triggers": [trigger],
            "tags": tags,
            "at_least_one": False,
            "stop_after_first": not parallel,
        }
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": not parallel,
    }


def structural_tag(fmt: Fmt) -> Fmt:
    return {"type": "structural_tag", "format": fmt}
