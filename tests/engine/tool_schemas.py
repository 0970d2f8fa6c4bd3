"""OpenAI tools built from JSONSchemaBench's real schemas (../shared/data/jsonschemabench), and
the check that a call's arguments follow their tool's schema."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parents[2]
_DATA = Path("shared") / "data" / "jsonschemabench" / "schemas.jsonl"
# ../shared beside the checkout (CI and worktrees); shared/ inside it where a machine carries it.
SCHEMAS = next((p for p in (ROOT.parent / _DATA, ROOT / _DATA) if p.exists()), ROOT.parent / _DATA)
_ROOT_KEYS = ("$schema", "$id", "definitions", "$defs")  # stay at the root of a wrapped schema


@dataclass(frozen=True)
class SchemaTool:
    id: str  # the schema's id in schemas.jsonl
    name: str
    tool: dict[str, Any]  # the OpenAI tool
    wrapped: bool  # a non-object schema, made the property "value" of an object

    @property
    def parameters(self) -> dict[str, Any]:
        return self.tool["function"]["parameters"]  # type: ignore[no-any-return]

    def choice(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name}}


def object_parameters(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """`schema` as a tool's parameters (an object schema), and whether it had to be wrapped:
    a schema that is not `"type": "object"` becomes the required property `value`, its
    definitions kept at the root and its references to the root pointed at the property."""
    if schema.get("type") == "object":
        return schema, False
    inner = {k: v for k, v in schema.items() if k not in _ROOT_KEYS}
    text = json.dumps(inner).replace('"$ref": "#"', '"$ref": "#/properties/value"')
    for key in ("/properties/", "/items", "/allOf/", "/anyOf/", "/oneOf/"):
        text = text.replace(f'"$ref": "#{key}', f'"$ref": "#/properties/value{key}')
    root = {k: schema[k] for k in _ROOT_KEYS if k in schema}
    root.update(type="object", properties={"value": json.loads(text)}, required=["value"])
    return root, True


def schema_tools(path: Path = SCHEMAS) -> list[SchemaTool]:
    """One tool per schema of the file, named `tool_<line>`."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, row in enumerate(rows):
        params, wrapped = object_parameters(row["schema"])
        name = f"tool_{i}"
        fn = {"name": name, "description": f"Records a {row['split']} item.", "parameters": params}
        out.append(SchemaTool(row["id"], name, {"type": "function", "function": fn}, wrapped))
    return out


def schema_errors(arguments: str, schema: dict[str, Any]) -> list[str]:
    """Why `arguments` (JSON text) is not an instance of `schema` (empty: it is). Formats are
    annotations, as the JSON Schema spec has them by default."""
    instance = json.loads(arguments)
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [e.message[:160] for e in validator.iter_errors(instance)]
