"""`function_specs`: the OpenAI tools list checked at the boundary, errors naming the field."""

from __future__ import annotations

import re

import pytest

from radixserve.tools import FunctionSpec, function_specs, new_call_id

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    },
}


def test_tools_list_to_specs() -> None:
    specs = function_specs([WEATHER, {"type": "function", "function": {"name": "now"}}])
    assert specs[0] == FunctionSpec(
        "get_weather",
        "Weather of a city",
        WEATHER["function"]["parameters"],
        True,  # type: ignore[index]
    )
    assert specs[1].name == "now" and not specs[1].strict and specs[1].description == ""
    assert specs[1].parameters == {"type": "object", "properties": {}}
    assert function_specs([]) == ()


def fn(**fields: object) -> dict[str, object]:
    return {"type": "function", "function": {"name": "f", **fields}}


@pytest.mark.parametrize(
    ("tools", "where"),
    [
        ("nope", "tools: must be a list"),
        ([WEATHER, WEATHER], "tools[1].function.name: 'get_weather' is named twice"),
        ([WEATHER, 3], "tools[1]: must be an object"),
        ([WEATHER, {"type": "retrieval"}], "tools[1].type: must be 'function'"),
        ([WEATHER, WEATHER, {"type": "function"}], "tools[2].function: must be an object"),
        ([fn(name="bad name!")], "tools[0].function.name: must be 1-64"),
        ([fn(name="x" * 65)], "tools[0].function.name: must be 1-64"),
        ([fn(description=3)], "tools[0].function.description: must be a string"),
        ([fn(strict="yes")], "tools[0].function.strict: must be a boolean"),
        ([fn(parameters=[1])], "tools[0].function.parameters: must be a JSON schema object"),
        (
            [fn(parameters={"type": "objekt"})],
            "tools[0].function.parameters['type']: not a valid JSON schema",
        ),
        (
            [fn(parameters={"type": "object", "properties": {"a": {"minLength": -1}}})],
            "tools[0].function.parameters['properties']['a']['minLength']: not a valid JSON schema",
        ),
        ([fn(params={})], "tools[0].function: unknown field(s) ['params']"),
        # arguments are an object (OpenAI's rule): a forced call of another type could not be read
        ([fn(parameters={"type": "string"})], "tools[0].function.parameters.type: must be 'object'"),
        ([fn(parameters={"type": ["array", "null"]})], "tools[0].function.parameters.type: must be 'object'"),
    ],
)
def test_errors_name_the_field(tools: object, where: str) -> None:
    with pytest.raises(ValueError) as e:
        function_specs(tools)
    assert str(e.value).startswith(where), str(e.value)


def test_call_ids_are_openai_shaped_and_unique() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
