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
in BENCHMARKS.md with its effect on validity.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from radixserve.constrained.regex_rewrite import optional_groups

_MERGE_UNION = ("required",)
# Keywords that stay beside a oneOf/anyOf when the others move into its branches.
_NOT_PUSHED = frozenset(
    ("$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "examples", "default")
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
        target = _resolve({"$ref": ref}, root)
        if "$ref" not in target:  # resolved: the root becomes its target (beside its definitions)
            rest = {k: v for k, v in root.items() if k != "$ref" and k not in _NOT_PUSHED}
            kept = {k: v for k, v in root.items() if k in _NOT_PUSHED and k not in target}
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
    if isinstance(node.get("allOf"), list):
        node = _flatten_all_of(node, root)
        node = _conditionals_to_branches(node, root, depth)
    if isinstance(node.get("allOf"), list):
        merged = _merge_all_of(node, root)
        if merged is not None:
            node = merged
    node = _push_into_branches(node, root, depth)
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


def _resolve(part: Any, root: dict[str, Any]) -> Any:
    ref = part.get("$ref") if isinstance(part, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/") or set(part) - _ANNOTATIONS - {"$ref"}:
        return part
    target: Any = root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or token not in target:
            return part
        target = target[token]
    if not isinstance(target, dict) or "$ref" in target:
        return part
    return copy.deepcopy(target)


def _flatten_all_of(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Resolve the parts' local $refs and lift the allOf of a part into the node's."""
    parts: list[Any] = []
    for part in node["allOf"]:
        part = _resolve(part, root)
        if isinstance(part, dict) and isinstance(part.get("allOf"), list) and "$ref" not in part:
            parts.append({k: v for k, v in part.items() if k != "allOf"})
            parts.extend(_resolve(p, root) for p in part["allOf"])
        else:
            parts.append(part)
    return {**node, "allOf": parts}


def _merge_all_of(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any] | None:
    parts = [_resolve(p, root) for p in node["allOf"]]
    base = {k: v for k, v in node.items() if k != "allOf"}
    out: dict[str, Any] = {}
    for part in [base, *parts]:
        if not isinstance(part, dict) or "$ref" in part or "allOf" in part:
            return None
        for key, value in part.items():
            if key not in out:
                out[key] = copy.deepcopy(value)
            elif key == "properties" and isinstance(value, dict) and isinstance(out[key], dict):
                for name, sub in value.items():
                    if name in out[key] and out[key][name] != sub:
                        out[key][name] = {"allOf": [out[key][name], sub]}
                    else:
                        out[key][name] = sub
            elif key in _MERGE_UNION and isinstance(value, list) and isinstance(out[key], list):
                out[key] = out[key] + [v for v in value if v not in out[key]]
            elif out[key] != value and key not in _ANNOTATIONS:
                return None  # conflicting keywords: leave the allOf to xgrammar
    return out


def _push_into_branches(node: dict[str, Any], root: dict[str, Any], depth: int) -> dict[str, Any]:
    """`{"required": [...], "oneOf": [A, B]}` -> `{"oneOf": [A + required, B + required]}`."""
    for key in ("oneOf", "anyOf"):
        branches = node.get(key)
        siblings = {k: v for k, v in node.items() if k != key and k not in _NOT_PUSHED}
        if (
            not isinstance(branches, list)
            or not branches
            or not siblings
            or any(k in siblings for k in ("oneOf", "anyOf", "allOf", "$ref"))
        ):
            continue
        merged = [_merge_all_of({**siblings, "allOf": [b]}, root) for b in branches]
        if any(m is None for m in merged):
            continue  # a conflict: leave it to xgrammar (listed as not enforced)
        kept = {k: v for k, v in node.items() if k in _NOT_PUSHED}
        return {**kept, key: [_walk(m, root, depth + 1) for m in merged]}
    return node


_ANNOTATIONS = frozenset(("$comment", "title", "description", "examples", "default"))


def _strip(part: Any) -> Any:
    return {k: v for k, v in part.items() if k not in _ANNOTATIONS} if isinstance(part, dict) else part


def _condition(part: Any) -> tuple[str, list[Any], Any, Any] | None:
    """(property, values, then, else) of `{"if": {"properties": {p: {"const"|"enum": ...}}}, ...}`."""
    part = _strip(part)
    if not isinstance(part, dict) or "if" not in part or set(part) - {"if", "then", "else"}:
        return None
    cond = _strip(part["if"])
    props = cond.get("properties") if isinstance(cond, dict) else None
    if not isinstance(props, dict) or len(props) != 1 or set(cond) - {"properties", "required"}:
        return None
    ((name, sub),) = props.items()
    sub = _strip(sub)
    if isinstance(sub, dict) and set(sub) == {"const"}:
        values = [sub["const"]]
    elif isinstance(sub, dict) and set(sub) == {"enum"} and isinstance(sub["enum"], list):
        values = list(sub["enum"])
    else:
        return None
    return name, values, part.get("then"), part.get("else")


def _excluded(part: Any) -> list[str] | None:
    """The names of `{"not": {"required": [a, b]}}` (not all of them present), else None."""
    part = _strip(part)
    if not isinstance(part, dict) or set(part) != {"not"}:
        return None
    inner = _strip(part["not"])
    names = inner.get("required") if isinstance(inner, dict) and set(inner) == {"required"} else None
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def _conditionals_to_branches(node: dict[str, Any], root: dict[str, Any], depth: int) -> dict[str, Any]:
    """An allOf of if/then/else parts on one discriminating property -> anyOf, a branch per value.

    Branch v is the rest of the schema with the property fixed to v, every `then`
    whose condition holds for v and every `else` whose condition does not
    (the discriminator becomes required: stricter, never invalid). Parts
    `{"not": {"required": [...]}}` drop one optional name from the properties."""
    conds = [_condition(p) for p in node["allOf"]]
    names = {c[0] for c in conds if c is not None}
    if len(names) != 1:
        return node
    (name,) = names
    excluded = [_excluded(p) for p in node["allOf"]]
    others = [p for p, c, x in zip(node["allOf"], conds, excluded) if c is None and x is None]
    merged = _merge_all_of(
        {**{k: v for k, v in node.items() if k != "allOf" and k not in _NOT_PUSHED}, "allOf": others}, root
    )
    if merged is None:
        return node
    base: dict[str, Any] = merged
    props = base.get("properties", {})
    prop = props.get(name, {}) if isinstance(props, dict) else None
    if not isinstance(prop, dict):
        return node
    # The discriminator's schema moves into the branches, each narrowing it to one value.
    base = {**base, "properties": {k: v for k, v in props.items() if k != name}}
    plain = {k: v for k, v in prop.items() if k not in ("enum", "const")}
    values = prop["enum"] if isinstance(prop.get("enum"), list) else [v for c in conds if c for v in c[1]]
    if len(values) > 64:
        return node
    branches: list[Any] = []
    for value in [v for i, v in enumerate(values) if v not in values[:i]]:
        parts: list[Any] = [{"properties": {name: {**plain, "const": value}}, "required": [name]}]
        drops = [x for x in excluded if x is not None]
        for c in conds:
            if c is None:
                continue
            chosen = c[2] if value in c[1] else c[3]
            if chosen is None or chosen is True:
                continue
            if _excluded(chosen) is not None:
                drops.append(_excluded(chosen))  # type: ignore[arg-type]
            else:
                parts.append(chosen)
        branch = _merge_all_of({**base, "allOf": parts}, root)
        if branch is None:
            return node
        if all(_drop_one(branch, d) for d in drops):
            branches.append(_walk(branch, root, depth + 1))  # else no instance with it is valid
    if not branches:
        return node
    kept = {k: v for k, v in node.items() if k in _NOT_PUSHED}
    return {**kept, "anyOf": branches}


def _drop_one(branch: dict[str, Any], names: list[str]) -> bool:
    """Make sure not all of `names` appear: remove an optional one. False if all are required."""
    required = branch.get("required") or []
    props = branch.get("properties") or {}
    if branch.get("additionalProperties", False) is not False or "patternProperties" in branch:
        return False  # an unlisted key could still be written: cannot enforce it by removal
    if any(n not in props for n in names):
        return True  # one of them can never be written (strict mode)
    optional = [n for n in names if n not in required]
    if not optional:
        return False
    del props[optional[-1]]
    return True


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
