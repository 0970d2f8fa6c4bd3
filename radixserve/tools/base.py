"""`ToolParser`: a model family's way of writing tool calls, read back from its output.

A format names its opening markers, a scanner that reads one call after a marker, how it writes
a call, and the shape of a call for structural tags. Parsing, streaming and the content rules
are shared (`radixserve/tools/stream.py`): `parse(text)` is a stream fed the whole text, so
every split of an output into pieces gives the same calls and content as `parse`.

With `tools` given, a call naming another function is not a call (it stays content).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from radixserve.tools import structural
from radixserve.tools.scan import CallScanner
from radixserve.tools.stream import ToolStream
from radixserve.tools.types import FunctionSpec, ParsedText, TextDelta, ToolCall


class ToolParser(ABC):
    markers: ClassVar[tuple[str, ...]]  # what opens a call (none a prefix of another)
    separators: ClassVar[str] = ""  # characters between calls that are not content
    call_separator: ClassVar[str] = "\n"  # what `write_calls` and structural tags put between calls
    trigger: ClassVar[str]  # what starts a call in mode "auto" of a structural tag

    def __init__(self, tools: Sequence[FunctionSpec] = ()) -> None:
        self.tools = tuple(tools)
        self.known = frozenset(t.name for t in self.tools)

    @abstractmethod
    def scanner(self, marker: str) -> CallScanner:
        """A fresh scanner for the call that `marker` opened."""

    @abstractmethod
    def write_call(self, call: ToolCall) -> str:
        """The text of one call as the model writes it."""

    @abstractmethod
    def call_shape(self) -> structural.CallShape:
        """One call around its arguments object, for structural tags."""

    def write_calls(self, calls: Sequence[ToolCall]) -> str:
        return self.call_separator.join(self.write_call(c) for c in calls)

    def stream(self) -> ToolStream:
        return ToolStream(self.markers, self.scanner, self.separators)

    def parse(self, text: str) -> ParsedText:
        s = self.stream()
        return assemble([s.feed(text), s.finish()])

    def structural_tag(
        self,
        tools: Sequence[FunctionSpec],
        mode: structural.Mode,
        parallel: bool = True,
        function: str | None = None,
    ) -> dict[str, object]:
        """An xgrammar structural tag (JSON form) that makes the output's calls well formed;
        `function` names the function of mode "named". See `radixserve/tools/structural.py`."""
        fmt = structural.calls_format(
            self.call_tags(tools, mode, function), self.trigger, self.call_separator, mode, parallel
        )
        return structural.structural_tag(fmt)

    def call_tags(
        self, tools: Sequence[FunctionSpec], mode: structural.Mode, function: str | None
    ) -> list[structural.Fmt]:
        """One structural tag per function a call may name under `mode`."""
        shape = self.call_shape()
        return [structural.call_tag(shape, f, mode) for f in structural.chosen(tools, mode, function)]


def assemble(deltas: Sequence[TextDelta]) -> ParsedText:
    """The whole answer from its deltas (what a client of the stream ends up with)."""
    content = "".join(d.content for d in deltas)
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.tool_calls:
            if c.id is not None:
                ids[c.index] = c.id
            if c.name is not None:
                names[c.index] = c.name
            args.setdefault(c.index, []).append(c.arguments)
    calls = tuple(ToolCall(ids[i], names[i], "".join(args[i])) for i in sorted(args))
    return ParsedText(content, calls)
