"""Agent frameworks from PyPI run two-tool agents to completion against the embedded model through
the in-process OpenAI client (`async_openai_client` of `radixserve.testing`): OpenAI's Agents SDK
and pydantic-ai, each with their own OpenAI Chat Completions model class, greedy and bounded.

Each run forces a call to one of the two tools on its first turn (xgrammar keeps the call to the
schema) and then lets the model answer: plain text for the Agents SDK, pydantic-ai's structured
output tool for pydantic-ai. No `__init__.py` here: a package named `agents` would shadow the SDK.
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
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings as PydanticModelSettings
from pydantic_ai.usage import UsageLimits

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


class Report(BaseModel):
    """pydantic-ai's structured output: it sends this as an output tool (`final_result`)."""

    city: str
    weather: str


@pytest.mark.timeout(120)
def test_pydantic_ai_runs_a_two_tool_agent(
    async_openai_client: openai.AsyncOpenAI, radixserve_engine: Engine
) -> None:
    tools = Tools()
    model = OpenAIChatModel(
        radixserve_engine.engine.config.model, provider=OpenAIProvider(openai_client=async_openai_client)
    )

    def settings(ctx: RunContext[None]) -> PydanticModelSettings:
        # Step 1 must call one of the function tools: a list of two names goes out as
        # tool_choice {"type": "allowed_tools", "mode": "required"}. After it, "none" leaves only
        # the output tool, which pydantic-ai then forces by name: the run ends with a Report.
        choice: list[str] | str = ["get_weather", "get_time"] if ctx.run_step == 1 else "none"
        return PydanticModelSettings(
            tool_choice=choice, parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS
        )

    agent = PydanticAgent(
        model,
        output_type=Report,
        instructions=INSTRUCTIONS,
        tools=[tools.get_weather, tools.get_time],
        model_settings=settings,
    )
    result = run(agent.run(QUESTION, usage_limits=UsageLimits(request_limit=4)))
    assert tools.calls == [("get_weather", "Paris")]
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    called = [p.tool_name for r in responses for p in r.parts if isinstance(p, ToolCallPart)]
    assert called == ["get_weather", "final_result"]
    assert result.output == Report(city="Paris", weather="sunny")  # validated by pydantic-ai
    assert result.usage.requests == 2
