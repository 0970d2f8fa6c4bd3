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
- a string bounded only by `minLength`/`maxLength` becomes a `pattern` of
  that many plain characters (no quote, backslash or control character):
  xgrammar's bounded-string rule lets raw control characters through, which
  JSON forbids; the rewrite is stricter (no escapes) and always valid;
- keywords beside a `oneOf`/`anyOf` (`{"required": [...], "oneOf": [...]}`)
  are pushed into each branch: xgrammar enforces only the branches;
- a `$ref` at the root (beside its `definitions`) is replaced by its target:
  xgrammar accepted any value there;
- an `allOf` of conditionals on one discriminating property (`{"if":
  {"properties": {"type": {"const": "static"}}}, "then": {...}}`, as JSON
  Schema Store writes them) becomes an `anyOf` with one branch per value of
  that property (its `then` merged in) and one for the remaining values of
  its `enum`; the discriminator becomes required (stricter, never invalid).

What is left unenforced (oneOf with overlapping branches, read as anyOf;
fractional multipleOf; length limits next to a pattern or format) is listed
in BENCHMARKS.md with its effect on validity.
"""

from __future__ import annotations

import copy
from typing import Any

_MERGE_UNION = ("required",)
# Keywords that stay beside a oneOf/anyOf when the others move into its branches.
_NOT_PUSHED = frozenset(
    ("$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "examples", "default")
)
# One JSON string character written as itself: no quote, backslash or control character.
_PLAIN_CHAR = '[^"\\\\\\x00-\\x1f]'


def _is_plain_bounded_string(node: dict[str, Any]) -> bool:
    """A string schema whose only constraint is minLength/maxLength (integers)."""
    bounds = [node[k] for k in ("minLength", "maxLength") if k in node]
    return (
        node.get("type") == "string"
        and bool(bounds)
        and all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in bounds)
        and not any(k in node for k in ("pattern", "format", "enum", "const"))
    )


def prepare(schema: dict[str, Any]) -> dict[str, Any]:
    root = copy.deepcopy(schema)
    ref = root.get("$ref") if isinstance(root, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        target = _resolve({"$ref": ref}, root)
        if "$ref" not in target:  # resolved: the root is its target plus its own other keywords
            rest = {k: v for k, v in root.items() if k != "$ref"}
            merged = _merge_all_of({**rest, "allOf": [target]}, root)
            if merged is not None:
                root = merged
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
        node = _conditionals_to_branches(node, root)
    if isinstance(node.get("allOf"), list):
        merged = _merge_all_of(node, root)
        if merged is not None:
            node = merged
    node = _push_into_branches(node, root, depth)
    types = node.get("type")
    is_array = types == "array" or (isinstance(types, list) and "array" in types)
    if is_array and "items" not in node and "prefixItems" not in node:
        node["items"] = {}
    if _is_plain_bounded_string(node):
        # xgrammar's length-bounded string accepts raw control characters (JSON forbids
        # them); a pattern of unescaped characters enforces both the bound and JSON.
        lo, hi = int(node.pop("minLength", 0)), node.pop("maxLength", None)
        node["pattern"] = "^" + _PLAIN_CHAR + "{" + f"{lo},{'' if hi is None else int(hi)}" + "}$"
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
    if not isinstance(ref, str) or not ref.startswith("#/") or len(part) != 1:
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
            elif out[key] != value:
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


def _discriminator(part: Any) -> tuple[str, Any, dict[str, Any]] | None:
    """(property, value, then) of `{"if": {"properties": {p: {"const": v}}}, "then": T}`."""
    if not isinstance(part, dict) or set(part) != {"if", "then"}:
        return None
    cond, then = part["if"], part["then"]
    props = cond.get("properties") if isinstance(cond, dict) else None
    if not isinstance(then, dict) or not isinstance(props, dict) or len(props) != 1:
        return None
    if set(cond) - {"properties", "required"}:
        return None
    ((name, sub),) = props.items()
    if isinstance(sub, dict) and set(sub) == {"const"}:
        return name, sub["const"], then
    if isinstance(sub, dict) and set(sub) == {"enum"} and len(sub["enum"]) == 1:
        return name, sub["enum"][0], then
    return None


def _conditionals_to_branches(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """An allOf of if/then parts on one discriminating property -> anyOf, one branch per value."""
    conds = [_discriminator(p) for p in node["allOf"]]
    names = {c[0] for c in conds if c is not None}
    if len(names) != 1 or not any(c is not None for c in conds):
        return node
    (name,) = names
    others = [p for p, c in zip(node["allOf"], conds) if c is None]
    base = {k: v for k, v in node.items() if k != "allOf"}
    if others:
        merged_base = _merge_all_of({**base, "allOf": others}, root)
        if merged_base is None:
            return node
        base = merged_base
    prop = (base.get("properties") or {}).get(name, {})
    if not isinstance(prop, dict):
        return node
    plain = {k: v for k, v in prop.items() if k not in ("enum", "const")}
    allowed = prop.get("enum") if isinstance(prop.get("enum"), list) else None
    branches: list[Any] = []
    seen: list[Any] = []
    for c in conds:
        if c is None or c[1] in seen or (allowed is not None and c[1] not in allowed):
            continue
        seen.append(c[1])
        pick = {"properties": {name: {**plain, "const": c[1]}}, "required": [name]}
        branches.append({**pick, "allOf": [c[2]]})
    if allowed is not None:
        rest = [v for v in allowed if v not in seen]
        if rest:
            branches.append({"properties": {name: {**plain, "enum": rest}}, "required": [name]})
    resolved = []
    for b in branches:  # each branch: its discriminator plus its `then`
        m = _merge_all_of(b, root) if "allOf" in b else b
        if m is None:
            return node
        resolved.append(m)
    if not resolved:
        return node
    # The discriminator's own schema moves into the branches (their const/enum narrow it).
    base_props = {k: v for k, v in (base.get("properties") or {}).items() if k != name}
    base = {**base, "properties": base_props} if "properties" in base else base
    return {**base, "anyOf": resolved}
