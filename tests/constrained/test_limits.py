"""Per-request grammar limits and refused regex features, through `SamplingParams`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixserve import SamplingParams
from radixserve.constrained.limits import LIMITS
from radixserve.constrained.regex_features import unenforceable

pytestmark = pytest.mark.timeout(60)


def _deep(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _deep_text(depth: int) -> str:
    return '{"type":"array","items":' * depth + '{"type":"string"}' + "}" * depth


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(json_schema="x" * (LIMITS.max_schema_bytes + 1)), "GrammarLimits.max_schema_bytes"),
        (dict(json_schema=_deep_text(10_000)), "GrammarLimits.max_depth"),
        (dict(json_schema=_deep(10_000)), "GrammarLimits.max_depth"),
        (dict(json_schema={"enum": list(range(LIMITS.max_enum_values + 1))}), "max_enum_values"),
        (dict(json_schema={"const": [0] * (LIMITS.max_enum_values + 1)}), "max_enum_values"),
        (dict(json_schema={"type": "object", "default": json.loads("[" * 200 + "]" * 200)}), "max_depth"),
        (dict(choice=[f"c{i}" for i in range(LIMITS.max_choices + 1)]), "GrammarLimits.max_choices"),
        (dict(choice=["x" * LIMITS.max_schema_bytes, "y"]), "GrammarLimits.max_schema_bytes"),
        (dict(regex="a" * (LIMITS.max_regex_chars + 1)), "GrammarLimits.max_regex_chars"),
        (dict(ebnf='root ::= "a"' + " " * LIMITS.max_ebnf_chars), "GrammarLimits.max_ebnf_chars"),
    ],
    ids=[
        "bytes",
        "depth-text",
        "depth-dict",
        "enum",
        "const",
        "values-depth",
        "choices",
        "choice-bytes",
        "regex",
        "ebnf",
    ],
)
def test_each_limit_refuses_with_its_name(kw: dict[str, Any], message: str) -> None:
    kind = next(iter(kw))
    with pytest.raises(ValueError, match=f"SamplingParams.{kind}: .*{message}"):
        SamplingParams(**kw)


def test_at_the_limits_requests_are_accepted() -> None:
    SamplingParams(json_schema=_deep(LIMITS.max_depth - 1))
    SamplingParams(json_schema=_deep_text(LIMITS.max_depth - 1))
    SamplingParams(json_schema={"enum": list(range(LIMITS.max_enum_values))})
    SamplingParams(choice=[f"c{i}" for i in range(LIMITS.max_choices)])
    # Brackets inside strings are not nesting.
    SamplingParams(json_schema={"type": "string", "description": "[" * 1000 + "{" * 1000})


@pytest.mark.parametrize(
    ("schema", "path", "feature"),
    [
        ({"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"}, "pattern", "lookahead"),
        (
            {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?!x)[a-z]+$"}}},
            "properties.code.pattern",
            "negative lookahead",
        ),
        (
            {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "(?<=a)b"}]},
            "anyOf.1.pattern",
            "lookbehind",
        ),
        (
            {"type": "object", "patternProperties": {"^(a)\\1$": {}}},
            "patternProperties.^(a)\\1$",
            "backreference",
        ),
        (
            {"$defs": {"t": {"type": "string", "pattern": "(?<n>a)\\k<n>"}}},
            "$defs.t.pattern",
            "backreference",
        ),
    ],
)
def test_lookaround_and_backreferences_are_refused_with_their_path(
    schema: dict[str, Any], path: str, feature: str
) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(json_schema=schema)
    msg = str(info.value)
    assert f" at {path} uses" in msg and feature in msg and "xgrammar" in msg
    with pytest.raises(ValueError, match=feature):
        SamplingParams(json_schema=json.dumps(schema))  # the same from JSON text


def test_regex_requests_and_harmless_patterns() -> None:
    with pytest.raises(ValueError, match="SamplingParams.regex: the pattern .*negative lookbehind"):
        SamplingParams(regex="(?<!a)b")
    for ok in [r"\(?=x", r"[(?=]+", r"[\[](?:x)", r"\\0", r"[\1]", r"(?<name>a)b", r"(?:ab)+", r"a\\\\1"]:
        assert unenforceable(ok) is None, ok
        SamplingParams(regex=ok)
    # Values are data, not schemas: a "pattern" key under default/enum is not a pattern.
    SamplingParams(json_schema={"type": "object", "default": {"pattern": "(?=x)"}})
    assert unenforceable(r"[]](?!a)") == "a negative lookahead `(?!`"  # "]" first in a class is literal
    assert unenforceable(r"(?P<n>a)(?P=n)") == "a backreference `(?P=name)`"
