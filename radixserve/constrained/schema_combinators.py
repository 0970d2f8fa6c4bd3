"""The combinator rewrites of `json_schema.prepare`: allOf merging, keywords pushed down into
oneOf/anyOf branches, and allOf-of-conditionals split into one anyOf branch per case.

`json_schema` documents what each rewrite enforces; its walk passes itself in as `walk`
so that a branch built here is rewritten like any other subschema.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

Walk = Callable[[Any], Any]  # rewrites one subschema (one level deeper)

_MERGE_UNION = ("required",)
# Keywords that stay beside a oneOf/anyOf when the others move into its branches.
NOT_PUSHED = frozenset(
    ("$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "examples", "default")
)
_ANNOTATIONS = frozenset(("$comment", "title", "description", "examples", "default"))


def resolve(part: Any, root: dict[str, Any]) -> Any:
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


def flatten_all_of(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Resolve the parts' local $refs and lift the allOf of a part into the node's."""
    parts: list[Any] = []
    for part in node["allOf"]:
        part = resolve(part, root)
        if isinstance(part, dict) and isinstance(part.get("allOf"), list) and "$ref" not in part:
            parts.append({k: v for k, v in part.items() if k != "allOf"})
            parts.extend(resolve(p, root) for p in part["allOf"])
        else:
            parts.append(part)
    return {**node, "allOf": parts}


def merge_all_of(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any] | None:
    parts = [resolve(p, root) for p in node["allOf"]]
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


def push_into_branches(node: dict[str, Any], root: dict[str, Any], walk: Walk) -> dict[str, Any]:
    """`{"required": [...], "oneOf": [A, B]}` -> `{"oneOf": [A + required, B + required]}`."""
    for key in ("oneOf", "anyOf"):
        branches = node.get(key)
        siblings = {k: v for k, v in node.items() if k != key and k not in NOT_PUSHED}
        if (
            not isinstance(branches, list)
            or not branches
            or not siblings
            or any(k in siblings for k in ("oneOf", "anyOf", "allOf", "$ref"))
        ):
            continue
        merged = [merge_all_of({**siblings, "allOf": [b]}, root) for b in branches]
        if any(m is None for m in merged):
            continue  # a conflict: leave it to xgrammar (listed as not enforced)
        kept = {k: v for k, v in node.items() if k in NOT_PUSHED}
        return {**kept, key: [walk(m) for m in merged]}
    return node


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


def conditionals_to_branches(node: dict[str, Any], root: dict[str, Any], walk: Walk) -> dict[str, Any]:
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
    merged = merge_all_of(
        {**{k: v for k, v in node.items() if k != "allOf" and k not in NOT_PUSHED}, "allOf": others}, root
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
        branch = merge_all_of({**base, "allOf": parts}, root)
        if branch is None:
            return node
        if all(_drop_one(branch, d) for d in drops):
            branches.append(walk(branch))  # else no instance with it is valid
    if not branches:
        return node
    kept = {k: v for k, v in node.items() if k in NOT_PUSHED}
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
