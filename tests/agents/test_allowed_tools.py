"""OpenAI's `tool_choice={"type": "allowed_tools", ...}` on the chat route (what pydantic-ai sends
to force one of several tools): the mode over a subset of the tools, every tool still in the prompt;
a malformed one is a 400 naming tool_choice."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from radixserve.blocking import Engine


def _tool(name: str, description: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS = [_tool("get_weather", "Get the weather in a city."), _tool("get_time", "Get the time in a city.")]
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def allowed(mode: str, *names: str) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


@pytest.mark.timeout(120)
def test_required_over_a_subset_calls_only_that_subset(
    openai_client: openai.OpenAI, radixserve_engine: Engine
) -> None:
    model = radixserve_engine.engine.config.model

    def ask(tool_choice: Any, max_tokens: int) -> Any:
        return openai_client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=max_tokens,
        )

    # The question is about the weather, but only get_time is allowed.
    reply = ask(allowed("required", "get_time"), 64)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_time"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    # Both tools stay in the prompt: the same prompt as without a choice.
    plain = ask("none", 1)
    assert reply.usage is not None and plain.usage is not None
    assert reply.usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.mark.parametrize(
    ("tool_choice", "message"),
    [
        (allowed("always", "get_time"), '"mode": "auto"|"required"'),
        (allowed("auto"), "tools=[]: must be a non-empty list"),
        (allowed("auto", "get_date"), "tools[0].function.name='get_date': not one of the tools"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": ["get_time"]}}, "tools[0]="),
    ],
)
def test_a_malformed_allowed_tools_is_a_400(
    openai_client: openai.OpenAI, radixserve_engine: Engine, tool_choice: Any, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(
            model=radixserve_engine.engine.config.model,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=1,
        )
    assert message in str(info.value)
    assert info.value.body is not None and info.value.body["param"] == "tool_choice"  # type: ignore[index]
