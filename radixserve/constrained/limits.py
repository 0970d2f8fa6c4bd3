"""Per-request limits on structured-output inputs, checked where `SamplingParams` is built.

A request's grammar is compiled and kept in memory by the engine, so its size
is bounded before anything parses it: each limit below is a `ValueError` that
names the limit (an HTTP 400 through the servers' usual error path). Every
check is iterative: a schema nested 10,000 deep is refused by its depth, never
by a `RecursionError` (the text is measured before `json.loads`, a dict before
`json.dumps`).

JSON schema patterns (`pattern`, the keys of `patternProperties`) and `regex=`
requests are also refused when they use lookaround or backreferences, which
xgrammar would silently ignore (`regex_features.py`); the error names the
pattern and where it is in the schema (`properties.code.pattern`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixserve.constrained.regex_features import unenforceable

# Keywords whose values are data, not schemas: nothing under them is a pattern.
_VALUES = ("enum", "const", "default", "examples")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


@dataclass(frozen=True)
class GrammarLimits:
    # Bytes of a JSON schema's text (UTF-8); also the total of a `choice` list's strings.
    max_schema_bytes: int = 256 * 1024
    # Nesting of objects and arrays in a JSON schema (its JSON, not its $refs).
    max_depth: int = 128
    # Values of one `enum`, or items of one array `const` (xgrammar builds a branch each).
    max_enum_values: int = 4096
    # Strings in a `choice` list.
    max_choices: int = 4096
    # Characters of a `regex=` request, and of each `pattern` in a schema.
    max_regex_chars: int = 16 * 1024
    # Characters of an `ebnf=` grammar.
    max_ebnf_chars: int = 64 * 1024


LIMITS = GrammarLimits()  # the limits every request is checked against


def check_schema_text(text: str, limits: GrammarLimits = LIMITS) -> None:
    """Size and nesting of a schema's JSON text, before it is parsed."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_schema_bytes:
        raise ValueError(
            f"the schema is {size} bytes, more than {limits.max_schema_bytes} "
            "(GrammarLimits.max_schema_bytes)"
        )
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    _check_depth(deepest, limits)


def check_schema(schema: Any, limits: GrammarLimits = LIMITS) -> None:
    """Nesting, enum sizes and patterns of a parsed schema (a dict from the caller or json.loads)."""
    stack: list[tuple[Any, int, str]] = [(schema, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        _check_depth(depth, limits)
        if isinstance(node, list):
            stack.extend((x, depth + 1, _join(path, str(i))) for i, x in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            where = _join(path, str(key))
            if key in _VALUES:
                _check_values(key, value, where, depth + 1, limits)
            elif key == "pattern" and isinstance(value, str):
                _check_pattern(value, where, limits)
            elif key == "patternProperties" and isinstance(value, dict):
                for name in value:
                    _check_pattern(str(name), _join(where, str(name)), limits)
            if key not in _VALUES and isinstance(value, (dict, list)):
                stack.append((value, depth + 1, where))


def check_regex(pattern: str, limits: GrammarLimits = LIMITS) -> None:
    _check_pattern(pattern, "", limits)


def check_ebnf(text: str, limits: GrammarLimits = LIMITS) -> None:
    if len(text) > limits.max_ebnf_chars:
        raise ValueError(
            f"the grammar has {len(text)} characters, more than {limits.max_ebnf_chars} "
            "(GrammarLimits.max_ebnf_chars)"
        )


def check_choices(choices: tuple[str, ...], limits: GrammarLimits = LIMITS) -> None:
    if len(choices) > limits.max_choices:
        raise ValueError(
            f"{len(choices)} choices, more than {limits.max_choices} (GrammarLimits.max_choices)"
        )
    size = sum(len(c.encode("utf-8", "surrogatepass")) for c in choices)
    if size > limits.max_schema_bytes:
        raise ValueError(
            f"the choices hold {size} bytes, more than {limits.max_schema_bytes} "
            "(GrammarLimits.max_schema_bytes)"
        )


def _check_depth(depth: int, limits: GrammarLimits) -> None:
    if depth > limits.max_depth:
        raise ValueError(
            f"the schema nests deeper than {limits.max_depth} levels (GrammarLimits.max_depth)"
        )


def _check_values(key: str, value: Any, where: str, depth: int, limits: GrammarLimits) -> None:
    """Data under enum/const/default/examples: its nesting (iteratively) and enum sizes."""
    if key in ("enum", "const") and isinstance(value, list) and len(value) > limits.max_enum_values:
        raise ValueError(
            f"{where} has {len(value)} values, more than {limits.max_enum_values} "
            "(GrammarLimits.max_enum_values)"
        )
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        node, d = stack.pop()
        _check_depth(d, limits)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((x, d + 1) for x in children)


def _check_pattern(pattern: str, where: str, limits: GrammarLimits) -> None:
    at = f" at {where}" if where else ""
    if len(pattern) > limits.max_regex_chars:
        raise ValueError(
            f"the pattern{at} has {len(pattern)} characters, more than {limits.max_regex_chars} "
            "(GrammarLimits.max_regex_chars)"
        )
    feature = unenforceable(pattern)
    if feature is not None:
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        raise ValueError(
            f"the pattern {shown!r}{at} uses {feature}, which the grammar engine (xgrammar) "
            "cannot enforce; rewrite it without lookaround or backreferences"
        )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
