"""A chat request with tools and reasoning: what to run (`ChatPlan`) and how its outputs read.

One path for every entry point (`AsyncEngine.generate` / `complete` and the OpenAI route):

1. `plan_chat` checks `tools` (OpenAI's function list), `tool_choice` and
   `parallel_tool_calls`, renders the messages with the tools through the chat template
   (`prompts.render_chat`; a template without tool support gets the default Hermes tool
   prompt), and picks the parsers (`ChatParsers`: `EngineConfig.tool_call_parser` /
   `reasoning_parser`, "auto" reads the template).
2. It constrains decoding with an xgrammar structural tag built from the tools
   (`ToolParser.structural_tag`): `tool_choice="required"` or a named function allows only
   calls whose arguments follow a strict tool's schema (any JSON object for a non-strict
   one); "auto" leaves text free and constrains from a call's opening tag on; OpenAI's
   `{"type": "allowed_tools", ...}` is its mode over a subset of the tools; "none" means no
   constraint and no parsing (the tools are still in the prompt, as vLLM does). A request
   that already has a constraint (`json_schema`, ...) keeps it under "auto" and cannot use
   "required" or a named function.
3. `ChatPlan.rewriter()` (radixserve/chat_output.py) turns each completion's outputs into
   content, tool calls and reasoning as they stream (`ChatRewriter`): `text` / `delta_text`
   become the content with the markup removed, `tool_calls` the complete calls,
   `delta_tool_calls` their OpenAI-shaped pieces, `reasoning_text` the `<think>` block; a
   completion that stopped after calls ends with finish_reason "tool_calls". A malformed call
   under "auto" stays content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixserve.chat_output import ChatRewriter
from radixserve.prompts import JsonObject, Prompt, encode_text, is_chat, render_chat, template_source
from radixserve.sampling_params import SamplingParams
from radixserve.tools import (
    FunctionSpec,
    Mode,
    ReasoningParser,
    ToolParser,
    detect_tool_parser,
    function_specs,
    reasoning_parser,
    tool_parser,
)
from radixserve.tools.reasoning import detect_reasoning_parser

TOOL_CHOICES = ("none", "auto", "required")
# The format of the default tool prompt (radixserve/model/tool_prompt.py).
DEFAULT_TOOL_PARSER = "hermes"


@dataclass(frozen=True)
class ChatParsers:
    """The parsers a model's chat outputs go through (None: that part is not parsed)."""

    tool: str
    reasoning: str | None

    @staticmethod
    def resolve(tool: str | None, reasoning: str | None, tokenizer: Any) -> ChatParsers:
        """ "auto" reads the chat template: its tool-call markup (the default tool prompt's Hermes
        format when it has none) and whether it writes `<think>` blocks."""
        source = template_source(tokenizer) or ""
        if tool is None or tool == "auto":
            tool = detect_tool_parser(source) or DEFAULT_TOOL_PARSER
        else:
            tool_parser(tool)  # an unknown name fails here, at start-up
        if reasoning == "auto":
            reasoning = detect_reasoning_parser(source)
        elif reasoning is not None:
            reasoning_parser(reasoning)
        return ChatParsers(tool, reasoning)


@dataclass(frozen=True)
class ToolUse:
    """What a request asked of its tools."""

    tools: tuple[FunctionSpec, ...]
    choice: str  # "none", "auto", "required" or "named"
    function: str | None  # the function of choice "named"
    parallel: bool


def tool_use(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> ToolUse | None:
    """The request's tool options checked (ValueError naming the field); None without tools."""
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ValueError(f"parallel_tool_calls={parallel_tool_calls!r}: must be true or false")
    if tools is None or (isinstance(tools, Sequence) and not isinstance(tools, str) and not tools):
        if tool_choice not in (None, "none"):
            raise ValueError(f"tool_choice={_short(tool_choice)}: needs tools")
        return None
    specs = function_specs(tools)
    function = None
    if tool_choice is None:
        choice = "auto"
    elif isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice={tool_choice!r}: must be one of {TOOL_CHOICES} or a function")
        choice = tool_choice
    elif isinstance(tool_choice, Mapping) and tool_choice.get("type") == "allowed_tools":
        choice, specs = _allowed_tools(tool_choice.get("allowed_tools"), specs)
    elif isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise ValueError(
                f"tool_choice={_short(tool_choice)}: must be "
                '{"type": "function", "function": {"name": ...}} or {"type": "allowed_tools", ...}'
            )
        if name not in {s.name for s in specs}:
            raise ValueError(f"tool_choice.function.name={name!r}: not one of the tools")
        choice, function = "named", name
    else:
        raise ValueError(f"tool_choice={_short(tool_choice)}: must be a string or an object")
    return ToolUse(specs, choice, function, True if parallel_tool_calls is None else parallel_tool_calls)


def _allowed_tools(allowed: Any, specs: tuple[FunctionSpec, ...]) -> tuple[str, tuple[FunctionSpec, ...]]:
    """OpenAI's `{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`: the mode ("auto" or
    "required") over the named subset of the tools. All tools stay in the prompt (the caller keeps
    its prompt cache); calls are constrained, and parsed, to the subset."""
    field = "tool_choice.allowed_tools"
    if not isinstance(allowed, Mapping) or allowed.get("mode") not in ("auto", "required"):
        raise ValueError(f'{field}={_short(allowed)}: must be {{"mode": "auto"|"required", "tools": [...]}}')
    listed = allowed.get("tools")
    if not isinstance(listed, Sequence) or isinstance(listed, str) or not listed:
        raise ValueError(f"{field}.tools={_short(listed)}: must be a non-empty list")
    names: set[str] = set()
    for i, t in enumerate(listed):
        fn = t.get("function") if isinstance(t, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(name, str):
            shape = '{"type": "function", "function": {"name": ...}}'
            raise ValueError(f"{field}.tools[{i}]={_short(t)}: must be {shape}")
        if name not in {s.name for s in specs}:
            raise ValueError(f"{field}.tools[{i}].function.name={name!r}: not one of the tools")
        names.add(name)
    return str(allowed["mode"]), tuple(s for s in specs if s.name in names)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class ChatPlan:
    """A chat request's prompt text, its tool use and the parsers of its outputs."""

    prompt: str
    tool_use: ToolUse | None  # None: no tools (or tool_choice "none"): outputs are not parsed for calls
    tool_parser: ToolParser | None
    reasoning: ReasoningParser | None  # None: no reasoning block is split off
    special_markup: bool  # a call's opening marker is a special token (kept in the text)

    def constrain(self, params: SamplingParams) -> SamplingParams:
        """`params` with the structural tag of the forced or triggered calls (ValueError when
        `tool_choice` forces calls and `params` has a constraint of its own)."""
        use, parser = self.tool_use, self.tool_parser
        if use is None or parser is None:
            return params
        if self.special_markup:
            params = params.replace(skip_special_tokens=False)
        if params.grammar is not None:
            if use.choice == "auto":
                return params  # the caller's constraint stands; calls are still parsed
            raise ValueError(
                f"tool_choice={use.choice!r}: cannot be combined with a {params.grammar.kind} constraint"
            )
        mode: Mode = "named" if use.choice == "named" else "required" if use.choice == "required" else "auto"
        tag = parser.structural_tag(use.tools, mode, parallel=use.parallel, function=use.function)
        return params.replace(structural_tag=tag)

    def rewriter(self) -> ChatRewriter | None:
        if self.tool_parser is None and self.reasoning is None:
            return None
        return ChatRewriter(self.tool_parser, self.reasoning)


def plan_chat(
    tokenizer: Any,
    parsers: ChatParsers,
    messages: Sequence[Any],
    *,
    tools: Any = None,
    tool_choice: Any = None,
    parallel_tool_calls: Any = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPlan:
    """Check the request's chat options and render its prompt (ValueError naming the field for
    anything a caller got wrong); `ChatPlan.constrain` then fits its `SamplingParams`."""
    use = tool_use(tools, tool_choice, parallel_tool_calls)
    prompt = render_chat(tokenizer, messages, tools=tools or None, chat_template_kwargs=chat_template_kwargs)
    parser = None
    if use is not None and use.choice != "none":
        parser = tool_parser(parsers.tool, use.tools)
    else:
        use = None
    reasoning = reasoning_parser(parsers.reasoning, prompt=prompt) if parsers.reasoning else None
    special = parser is not None and _markup_is_special(tokenizer, parser)
    return ChatPlan(prompt, use, parser, reasoning, special)


def _markup_is_special(tokenizer: Any, parser: ToolParser) -> bool:
    """Whether a call's opening marker is one special token (Mistral's `[TOOL_CALLS]`), which
    detokenizing with skip_special_tokens would drop from the text the parser reads."""
    for marker in parser.markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == "":
            return True
    return False


@dataclass(frozen=True)
class ChatOptions:
    """The chat options of `AsyncEngine.generate` / `complete` (OpenAI's shapes, checked by
    `plan_chat`)."""

    tools: Sequence[JsonObject] | None = None
    tool_choice: str | JsonObject | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: JsonObject | None = None

    @property
    def given(self) -> bool:
        return any(
            v is not None
            for v in (self.tools, self.tool_choice, self.parallel_tool_calls, self.chat_template_kwargs)
        )


def prepare_chat(
    tokenizer: Any, parsers: ChatParsers | None, prompt: Prompt, params: SamplingParams, options: ChatOptions
) -> tuple[Prompt, SamplingParams, ChatRewriter | None]:
    """A chat prompt rendered with its tools as ids (and `params` constrained for calls), and how
    its outputs are parsed; other prompts unchanged. `parsers` None: a model without tokenizer."""
    if not is_chat(prompt) or parsers is None:
        if options.given:
            raise ValueError(
                "tools, tool_choice, parallel_tool_calls and chat_template_kwargs apply to "
                "chat messages (a list of dicts), not to text or token ids"
            )
        return prompt, params, None
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    plan = plan_chat(
        tokenizer,
        parsers,
        list(prompt),
        tools=options.tools,
        tool_choice=options.tool_choice,
        parallel_tool_calls=options.parallel_tool_calls,
        chat_template_kwargs=options.chat_template_kwargs,
    )
    ids = encode_text(tokenizer, plan.prompt, add_special_tokens=False)
    return ids, plan.constrain(params), plan.rewriter()
