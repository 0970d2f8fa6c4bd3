"""`GrammarSpec`: what a request constrains its output to, in canonical text.

Built from `SamplingParams` (json_schema, regex, ebnf, choice) in the caller's
thread. Types, shapes and the per-request limits (`limits.py`: sizes, nesting,
enum lengths, lookaround in patterns) are checked here; the compile, which
can fail on a well-formed but unsupported input, happens later
in `GrammarCache`. The canonical text is the compile cache's key, so equal
schemas written with different spacing share one compile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixserve.constrained import limits

KINDS = ("json_schema", "regex", "ebnf", "choice", "structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # one of KINDS
    text: str  # canonical: JSON text for json_schema, choice and structural_tag; as given for regex, ebnf


def canonical_json_schema(value: Any) -> str:
    """A JSON string, a dict, or a pydantic model class -> compact JSON text.

    Keys keep their order: a schema's `properties` order is the output's key order.
    """
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        value = value.model_json_schema()  # pydantic v2 BaseModel class
    elif isinstance(value, str):
        value = _parsed(value)
    if isinstance(value, bool):  # JSON Schema allows `true` (anything) and `false` (nothing)
        raise ValueError("a boolean schema does not describe an output; use an object schema")
    if not isinstance(value, dict):
        raise ValueError(
            f"must be a JSON object (a str of JSON, a dict, or a pydantic model class), "
            f"got {type(value).__name__}"
        )
    return _checked_text(value)


def canonical_structural_tag(value: Any) -> str:
    """xgrammar's structural tag (`{"type": "structural_tag", "format": {...}}`, a dict or its
    JSON text) -> compact JSON text; its content is checked by the compile."""
    if isinstance(value, str):
        value = _parsed(value)
    if not isinstance(value, dict) or value.get("type") != "structural_tag":
        raise ValueError('must be an object {"type": "structural_tag", "format": {...}}')
    return _checked_text(value)


def _parsed(text: str) -> Any:
    limits.check_schema_text(text)  # size and nesting before the (recursive) parser
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e})") from None


def _checked_text(value: dict[str, Any]) -> str:
    """Compact JSON text of a schema-like object within the limits (the schemas inside too)."""
    limits.check_schema(value)  # nesting (before the recursive json.dumps), enums, patterns
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"is not serializable as JSON ({e})") from None
    limits.check_schema_text(text)
    return text


def canonical_choice(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError("must be a list of strings")
    choices = tuple(value)
    if not choices:
        raise ValueError("must hold at least one string")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError("must be non-empty strings")
    limits.check_choices(choices)
    return choices


def check_text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def check_regex(value: Any) -> str:
    text = check_text(value)
    limits.check_regex(text)
    return text


def check_ebnf(value: Any) -> str:
    text = check_text(value)
    limits.check_ebnf(text)
    return text


def spec_of(kind: str, value: Any) -> GrammarSpec:
    """The spec of an already normalized `SamplingParams` field."""
    if kind == "choice":
        return GrammarSpec(kind, json.dumps(list(value), ensure_ascii=False))
    return GrammarSpec(kind, value)
