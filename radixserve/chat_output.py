"""`ChatRewriter`: a chat request's outputs read as content, tool calls and reasoning, as they
stream (step 3 of radixserve/chat_plan.py's path)."""

from __future__ import annotations

from radixserve.outputs import RequestOutput, rewritten
from radixserve.tools import (
    ReasoningParser,
    ReasoningSplit,
    ReasoningStream,
    TextDelta,
    ToolCall,
    ToolParser,
    ToolStream,
)


class _Completion:
    """The parse state of one completion."""

    def __init__(self, tool: ToolParser | None, reasoning: ReasoningParser | None) -> None:
        self.tools: ToolStream | None = tool.stream() if tool is not None else None
        self.reasoning: ReasoningStream | None = reasoning.stream() if reasoning is not None else None
        self.read = 0  # characters of the output's text parsed so far
        self.content = ""
        self.reasoning_text = ""
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]

    def step(self, piece: str, final: bool) -> tuple[str, TextDelta]:
        split = self.reasoning.feed(piece) if self.reasoning is not None else ReasoningSplit("", piece)
        reasoning, content = split.reasoning, split.content
        if final and self.reasoning is not None:
            end = self.reasoning.finish()
            reasoning, content = reasoning + end.reasoning, content + end.content
        if self.tools is None:
            return reasoning, TextDelta(content)
        delta = self.tools.feed(content)
        if final:
            end_delta = self.tools.finish()
            delta = TextDelta(delta.content + end_delta.content, delta.tool_calls + end_delta.tool_calls)
        return reasoning, delta


class ChatRewriter:
    """Rewrites a request's outputs (any of its n completions, in order) as content, tool calls
    and reasoning. Works on streamed outputs and on `complete`'s final ones alike: each output
    is read from its cumulative `text`."""

    def __init__(self, tool: ToolParser | None, reasoning: ReasoningParser | None) -> None:
        self._tool = tool
        self._reasoning = reasoning
        self._completions: dict[int, _Completion] = {}

    def __call__(self, out: RequestOutput) -> RequestOutput:
        c = self._completions.get(out.index)
        if c is None:
            c = self._completions[out.index] = _Completion(self._tool, self._reasoning)
        piece, c.read = out.text[c.read :], len(out.text)
        reasoning, delta = c.step(piece, out.finished)
        c.content += delta.content
        c.reasoning_text += reasoning
        for d in delta.tool_calls:
            call = c.calls.setdefault(d.index, ["", "", ""])
            call[0] = d.id if d.id is not None else call[0]
            call[1] = d.name if d.name is not None else call[1]
            call[2] += d.arguments
        calls = tuple(ToolCall(i, n, a) for i, n, a in (c.calls[k] for k in sorted(c.calls)))
        reason = out.finish_reason
        if out.finished and calls and reason == "stop":
            reason = "tool_calls"
        if out.finished:
            del self._completions[out.index]
        return rewritten(
            out,
            text=c.content,
            delta_text=delta.content,
            tool_calls=calls,
            delta_tool_calls=delta.tool_calls,
            reasoning_text=c.reasoning_text if self._reasoning is not None else None,
            delta_reasoning_text=reasoning,
            finish_reason=reason,
        )
