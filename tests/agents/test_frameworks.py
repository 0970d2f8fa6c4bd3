"""Agent frameworks from PyPI run two-tool agents to completion against the embedded model through
the in-process OpenAI client (`async_openai_client` of `radixserve.testing`): OpenAI's Agents SDK
and pydantic-ai, each with their own OpenAI Chat Completions model class, greedy and bounded.

The model is forced to call a tool on the first turn (xgrammar keeps the call to the schema) and
left free on the next, so the run answers after one round of tools. No `__init__.py` here: a
package named `agents` would shadow the Agents SDK's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from radixserve.blocking import Engine

T = TypeVar("T")
QUESTION = "What is the weather in Paris?"
INSTRUCTIONS = "You answer questions using the tools."
MAX_TOKENS = 64  # a forced call with its markup takes ~35 tokens; the answer is cut there too
RUN_TIMEOUT = 100.0  # a hang check, far above the few seconds a run takes


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an agent on a loop of the test's own (the in-process client hands requests to the
    engine's loop)."""
    return asyncio.run(asyncio.wait_for(coro, RUN_TIMEOUT))


class Tools:
    """Two tools that record their calls: (name, city)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def get_weather(self, city: str) -> str:
        """Get the current weather in a city."""
        assert isinstance(city, str) and city  # the framework validated the arguments
        self.calls.append(("get_weather", city))
        return f"It is sunny in {city}."

    def get_time(self, city: str) -> str:
        """Get the local time in a city."""
        assert isinstance(city, str) and city
        self.calls.append(("get_time", city))
        return f"It is 10:00 in {city}."


@pytest.mark.timeout(120)
def test_openai_agents_sdk_runs_a_two_tool_agent(
    async_openai_client: openai.AsyncOpenAI, radixserve_engine: Engine
) -> None:
    set_tracing_disabled(True)  # nothing goes to OpenAI's trace exporter
    tools = Tools()

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return tools.get_weather(city)

    @function_tool
    def get_time(city: str) -> str:
        """Get the local time in a city."""
        return tools.get_time(city)

    agent = Agent(
        name="assistant",
        instructions=INSTRUCTIONS,
        tools=[get_weather, get_time],
        model=OpenAIChatCompletionsModel(
            model=radixserve_engine.engine.config.model, openai_client=async_openai_client
        ),
        # The SDK resets tool_choice after a tool call (Agent.reset_tool_choice), so turn 2 answers.
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS
        ),
    )
    result = run(Runner.run(agent, QUESTION, max_turns=4, run_config=RunConfig(tracing_disabled=True)))
    assert tools.calls == [("get_weather", "Paris")]
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(result.final_output, str) and "sunny" in result.final_output
