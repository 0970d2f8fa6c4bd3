"""Regex, JSON and typed generation in programs, through the engine's structured output.

These need SamplingParams.regex/json_schema (the structured-output branch); they are
not skipped without it, so that a build lacking it shows here as failing.
"""

from __future__ import annotations

import json
import re
from typing import Any

import radixserve.lang as sgl
from radixserve import Engine

IP = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"


def test_regex(eng: Engine) -> None:
    @sgl.function
    def regex_gen(s: Any) -> None:
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + sgl.gen("answer", max_tokens=20, regex=IP)

    st = regex_gen.run(temperature=0)
    assert re.fullmatch(IP, st["answer"]), st["answer"]
    assert st.text().endswith("A: " + st["answer"])


def test_json_schema(eng: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "is_capital": {"type": "boolean"}},
        "required": ["name", "is_capital"],
        "additionalProperties": False,
    }

    @sgl.function
    def city(s: Any) -> None:
        s += sgl.user("Describe Paris as JSON: its name and whether it is a capital.")
        s += sgl.assistant(sgl.gen("info", max_tokens=48, json_schema=json.dumps(schema)))

    st = city.run(temperature=0)
    obj = json.loads(st["info"])
    assert set(obj) == {"name", "is_capital"}
    assert isinstance(obj["name"], str) and isinstance(obj["is_capital"], bool)
    assert st.messages()[-1]["content"] == st["info"]


def test_dtypes(eng: Engine) -> None:
    @sgl.function
    def dtype_gen(s: Any) -> None:
        s += "Q: What is the full name of DNS?\n"
        s += "A: The full name is " + sgl.gen("str_res", dtype=str, max_tokens=16) + "\n"
        s += "Q: Which year was DNS invented?\n"
        s += "A: " + sgl.gen("int_res", dtype=int, max_tokens=6) + "\n"
        s += "Q: What is the value of pi?\n"
        s += "A: " + sgl.gen("float_res", dtype=float, max_tokens=8) + "\n"
        s += "Q: Is the sky blue?\n"
        s += "A: " + sgl.gen("bool_res", dtype=bool, max_tokens=3) + "\n"

    st = dtype_gen.run(temperature=0)
    assert re.fullmatch(r"[-+]?[0-9]+", st["int_res"])
    float(st["float_res"])
    assert st["bool_res"] in ("True", "False")
    assert st["str_res"].startswith('"') and st["str_res"].endswith('"')


def test_json_built_from_typed_gens(eng: Engine) -> None:
    @sgl.function
    def decode_json(s: Any) -> None:
        s += "Generate a JSON object to describe the basic city information of Paris.\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen_string(max_tokens=12) + ",\n"
            s += '  "population": ' + sgl.gen_int(max_tokens=8) + ",\n"
            s += '  "area": ' + sgl.gen(dtype=int, max_tokens=8) + "\n"
            s += "}"

    st = decode_json.run(temperature=0)
    obj = json.loads(st["json_output"])
    assert isinstance(obj["name"], str) and isinstance(obj["population"], int)
    assert isinstance(obj["area"], int)
