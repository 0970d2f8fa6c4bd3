"""Rewrite a JSON schema, as users write it, into one xgrammar enforces exactly.

xgrammar compiles JSON schemas in strict mode (properties and array items a
schema does not mention are not generated) and ignores a few keywords with a
warning, which would let invalid outputs through. `prepare()` fixes what it
can by rewriting into an equivalent schema or a stricter one whose instances
are all valid for the original:

- an array that says nothing about its items (`{"type": "array",
  "minItems": 1}`) gets `items: {}` (any value), which is what the schema
  means; in strict mode it would otherwise allow only `[]` (and fail to
  compile with minItems);
- `allOf` whose parts are all objects (after resolving local `$ref`s) is
  merged into one schema: properties and required lists united, the other
  keywords kept when the parts agree (when they conflict, it is left as is);
- `{"type": "number", "multipleOf": k}` with an integer k becomes
  `{"type": "integer", "multipleOf": k}` (xgrammar drops multipleOf on numbers);
- a `pattern` that is one character class repeated (`^[a-z0-9-]*$`) takes
  the `minLength`/`maxLength` beside it as its repeat count (xgrammar ignores
  lengths next to a pattern; up to a maximum of 256, since xgrammar expands
  a bounded repeat into states: `{0,4096}` takes minutes to compile);
- names in `required` that `properties` does not list get a property (the
  `additionalProperties` schema, or any value): strict mode would never
  write them, and the output would miss a required key;
- `enum`/`const` values of the wrong `type` are dropped (xgrammar follows
  the enum alone); a property left with no value is removed when optional;
- keywords beside a `oneOf`/`anyOf` (`{"required": [...], "oneOf": [...]}`)
  are pushed into each branch: xgrammar enforces only the branches;
- a `$ref` at the root (beside its `definitions`) is replaced by its target:
  xgrammar accepted any value there;
- an `allOf` of conditionals on one discriminating property (`{"if":
  {"properties": {"type": {"const": "static"}}}, "then": {...}, "else":
  {...}}`, as JSON Schema Store writes them, beside `{"not": {"required":
  [a, b]}}` parts) becomes an `anyOf` with one branch per value of that
  property, the `then`s and `else`s that apply merged in; the discriminator
  becomes required (stricter, never invalid). xgrammar reads an allOf it
  cannot merge as any value at all.

Patterns go through `regex_rewrite.optional_groups` (xgrammar misreads
`(ab*)?`). Raw control characters (which JSON forbids in strings and xgrammar's
length-bounded string rule lets through) are excluded by the backend instead:
JSON schemas compile against a vocabulary without the tokens that hold one.

What is left unenforced (oneOf with overlapping branches, read as anyOf;
fractional multipleOf; length limits next to a general pattern or a format) is listed
in the README ("Structured output"); BENCHMARKS.md shows its effect on validity.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from radixserve.constrained.regex_rewrite import optional_groups
from radixserve.constrained.schema_combinators import (
    NOT_PUSHED,
    conditionals_to_branches,
    flatten_all_of,
    merge_all_of,
    push_into_branches,
    resolve,
)

# `^[...]*$`, `^\\w+$`, `^.*$`: one character (class) repeated, anchored.
_REPEATED_CLASS = re.compile(r"\^?(\[(?:\\.|[^\]\\])+\]|\\[dwsDWS]|\.)([*+])\$?")
_MAX_REPEAT = 256  # the largest bounded repeat we write into a pattern
_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def prepare(schema: dict[str, Any]) -> dict[str, Any]:
    root = copy.deepcopy(schema)
    ref = root.get("$ref") if isinstance(root, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        target = resolve({"$ref": ref}, root)
        if "$ref" not in target:  # resolved: the root becomes its target (beside its definitions)
            rest = {k: v for k, v in root.items() if k != "$ref" and k not in NOT_PUSHED}
            kept = {k: v for k, v in root.items() if k in NOT_PUSHED and k not in target}
            root = {**kept, "allOf": [target, rest]} if rest else {**kept, **target}
    return _walk(root, root, 0)  # type: ignore[no-any-return]


def _walk(node: Any, root: dict[str, Any], depth: int) -> Any:
    if depth > 64:
        return node
    if isinstance(node, list):
        return [_walk(x, root, depth + 1) for x in node]
    if not isinstance(node, dict):
        return node
    for key, value in list(node.items()):
        if key in ("enum", "const", "default", "examples"):
            continue  # values, not schemas
        node[key] = _walk(value, root, depth + 1)

    def deeper(sub: Any) -> Any:
        return _walk(sub, root, depth + 1)

    if isinstance(node.get("allOf"), list):
        node = flatten_all_of(node, root)
        node = conditionals_to_branches(node, root, deeper)
    if isinstance(node.get("allOf"), list):
        merged = merge_all_of(node, root)
        if merged is not None:
            node = merged
    node = push_into_branches(node, root, deeper)
    types = node.get("type")
    is_array = types == "array" or (isinstance(types, list) and "array" in types)
    if is_array and "items" not in node and "prefixItems" not in node:
        node["items"] = {}
    node = _bounded_pattern(node)
    if isinstance(node.get("pattern"), str):
        node["pattern"] = optional_groups(node["pattern"])
    node = _typed_values(node)
    if isinstance(node, dict) and node is not False:
        _required_properties(node)
    if not isinstance(node, dict):
        return node
    k = node.get("multipleOf")
    if (
        types == "number"
        and isinstance(k, (int, float))
        and not isinstance(k, bool)
        and k >= 1
        and k == int(k)
    ):
        node["type"] = "integer"
        node["multipleOf"] = int(k)
    return node


def _bounded_pattern(node: dict[str, Any]) -> dict[str, Any]:
    """`{"pattern": "^[a-z]*$", "minLength": 4}` -> `{"pattern": "^[a-z]{4,}$"}`."""
    pattern, lo, hi = node.get("pattern"), node.get("minLength"), node.get("maxLength")
    if not isinstance(pattern, str) or (lo is None and hi is None):
        return node
    if any(b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 0) for b in (lo, hi)):
        return node
    m = _REPEATED_CLASS.fullmatch(pattern)
    if m is None or not pattern.startswith("^") or not pattern.endswith("$"):
        return node  # a general pattern: the lengths stay unenforced (listed in BENCHMARKS.md)
    if hi is not None and hi > _MAX_REPEAT:
        return node  # compiling {lo,hi} would take minutes: the lengths stay unenforced
    lo = max(int(lo or 0), 1 if m.group(2) == "+" else 0)
    node = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    node["pattern"] = "^" + m.group(1) + "{" + f"{lo},{'' if hi is None else int(hi)}" + "}$"
    return node


def _typed_values(node: dict[str, Any]) -> Any:
    """Drop enum/const values that the node's `type` rules out; False when none is left."""
    types = node.get("type")
    names = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if not names or not all(isinstance(t, str) and t in _TYPE_CHECKS for t in names):
        return node
    ok = [_TYPE_CHECKS[t] for t in names]
    if "const" in node and not any(f(node["const"]) for f in ok):
        return False
    if isinstance(node.get("enum"), list):
        kept = [v for v in node["enum"] if any(f(v) for f in ok)]
        if not kept:
            return False
        node["enum"] = kept
    return node


def _required_properties(node: dict[str, Any]) -> None:
    """Give every required name a property; drop optional properties that admit no value."""
    props, required = node.get("properties"), node.get("required")
    if isinstance(props, dict):
        for name in [n for n, sub in props.items() if sub is False]:
            if not (isinstance(required, list) and name in required):
                del props[name]  # no value is valid: the key must not appear
    types = node.get("type")
    is_object = types == "object" or (isinstance(types, list) and "object" in types)
    if props is None and is_object:
        props = {}
    if not isinstance(required, list) or "patternProperties" in node or not isinstance(props, dict):
        return  # only object schemas (not a bare `{"required": [...]}` in a not/then)
    extra = node.get("additionalProperties", True)
    if extra is False:
        return  # unsatisfiable as written; left for the compiler to report
    missing = [n for n in required if isinstance(n, str) and n not in props]
    if not missing:
        return
    for name in missing:
        props[name] = {} if extra is True else copy.deepcopy(extra)
    node["properties"] = props
