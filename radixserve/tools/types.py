"""The tool-call data types, and `function_specs`: the OpenAI `tools` list checked at the boundary.

Everything here is a frozen value. A call's `arguments` is always a JSON text of an object (as
OpenAI sends it), written by `json.dumps(..., ensure_ascii=False)` from what the model wrote.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import jsonschema

from radixserve.constrained import limits

# OpenAI's rule for function names; it also keeps names safe inside the markup of every format.
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_TOOLS = 512
_EMPTY_PARAMETERS: Mapping[str, object] = {"type": "object", "properties": {}}


def new_call_id() -> str:
    """`call_` and 24 hex digits (96 random bits), the shape OpenAI's ids have."""
    return "call_" + secrets.token_hex(12)


def is_function_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class FunctionSpec:
    """One function a model may call (`tools[i].function` of an OpenAI request)."""

    name: str
    description: str = ""
    parameters: Mapping[str, object] = field(default_factory=lambda: dict(_EMPTY_PARAMETERS))
    strict: bool = False  # OpenAI's flag: arguments must follow `parameters` exactly


@dataclass(frozen=True)
class ToolCall:
    """A complete call: `arguments` is JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of call `index` (OpenAI's `delta.tool_calls[*]`).

    The first delta of a call carries `id` and `name` (and empty `arguments`); later ones carry
    only `arguments` pieces, which concatenate to the call's full `arguments`."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ParsedText:
    """A whole output split into what the user reads (`content`) and the calls."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """What one streamed piece of output adds: a `content` piece and call deltas."""

    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


def _require(cond: bool, where: str, why: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {why}")


def function_spec(tool: object, where: str = "tool") -> FunctionSpec:
    """One OpenAI tool (`{"type": "function", "function": {...}}`) -> `FunctionSpec`.

    Raises `ValueError` naming the field (`tools[2].function.name: ...`)."""
    _require(isinstance(tool, Mapping), where, "must be an object")
    assert isinstance(tool, Mapping)
    _require(tool.get("type") == "function", f"{where}.type", "must be 'function'")
    fn = tool.get("function")
    where = f"{where}.function"
    _require(isinstance(fn, Mapping), where, "must be an object")
    assert isinstance(fn, Mapping)
    unknown = set(fn) - {"name", "description", "parameters", "strict"}
    _require(not unknown, where, f"unknown field(s) {sorted(map(str, unknown))}")
    name = fn.get("name")
    _require(
        is_function_name(name), f"{where}.name", "must be 1-64 characters of a-z, A-Z, 0-9, '_', '.', '-'"
    )
    assert isinstance(name, str)
    description = fn.get("description", "")
    _require(isinstance(description, str), f"{where}.description", "must be a string")
    strict = fn.get("strict", False)
    _require(isinstance(strict, bool), f"{where}.strict", "must be a boolean")
    parameters = fn.get("parameters", _EMPTY_PARAMETERS)
    _require(isinstance(parameters, Mapping), f"{where}.parameters", "must be a JSON schema object")
    assert isinstance(parameters, Mapping)
    try:
        limits.check_schema(dict(parameters))  # before the recursive checks below
    except ValueError as e:
        raise ValueError(f"{where}.parameters: {e}") from None
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as e:
        path = "".join(f"[{p!r}]" for p in e.path)
        raise ValueError(f"{where}.parameters{path}: not a valid JSON schema ({e.message})") from None
    kind = parameters.get("type", "object")
    _require(  # OpenAI's rule: a call's arguments are an object
        kind == "object",
        f"{where}.parameters.type",
        f"must be 'object' (a call's arguments are an object), not {kind!r}",
    )
    return FunctionSpec(name, description, dict(parameters), strict)


def function_specs(tools: object) -> tuple[FunctionSpec, ...]:
    """An OpenAI `tools` list -> its `FunctionSpec`s; names must be unique."""
    _require(isinstance(tools, Sequence) and not isinstance(tools, str | bytes), "tools", "must be a list")
    assert isinstance(tools, Sequence)
    _require(len(tools) <= MAX_TOOLS, "tools", f"at most {MAX_TOOLS} tools")
    specs = tuple(function_spec(t, f"tools[{i}]") for i, t in enumerate(tools))
    seen: set[str] = set()
    for i, s in enumerate(specs):
        _require(s.name not in seen, f"tools[{i}].function.name", f"{s.name!r} is named twice")
        seen.add(s.name)
    return specs
