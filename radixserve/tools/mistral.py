"""Mistral tool calls, in both forms its templates use:

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]   (v0.3)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}       (newer)

After `[TOOL_CALLS]` come a JSON array of calls (all must be calls, or the whole block is
content), a single call object, or a name, `[ARGS]` and the arguments object. The parser writes,
and structural tags constrain, the array form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence

from radixserve.tools import structural
from radixserve.tools.base import ToolParser
from radixserve.tools.json_scan import JsonSpan, RawCall, arguments_text, loads, read_call
from radixserve.tools.scan import PENDING, CallScanner, Found, Malformed, Scan
from radixserve.tools.types import FunctionSpec, ToolCall, is_function_name

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]*")
_MAX_NAME = 64


class _Scanner(CallScanner):
    def __init__(self, known: Collection[str]) -> None:
        self._known = known
        self._compact: bool | None = None  # None until the first non-space character
        self._name: str | None = None  # compact form, once `[ARGS]` follows it
        self._at = 0  # where the next thing to read starts in the body
        self._start: int | None = None  # where the JSON value starts in the body
        self._span = JsonSpan()

    def push(self, body: str) -> Scan:
        if self._compact is None:
            lead = len(body) - len(body.lstrip())
            if lead == len(body):
                return PENDING
            self._compact = body[lead] not in "[{"
            self._at = lead
        if self._compact and self._name is None:
            name = _NAME_CHARS.match(body, self._at)
            assert name is not None
            rest = body[name.end() :]
            if name.end() - self._at > _MAX_NAME:
                return Malformed(0)
            if len(rest) < len(ARGS) and ARGS.startswith(rest):
                return PENDING
            if not rest.startswith(ARGS) or not is_function_name(name.group()):
                return Malformed(0)
            if self._known and name.group() not in self._known:
                return Malformed(0)
            self._name = name.group()
            self._at = name.end() + len(ARGS)
        if self._start is None:
            lead = len(body) - len(body[self._at :].lstrip())
            if lead == len(body):
                return PENDING
            if self._compact and body[lead] != "{":
                return Malformed(0)
            self._start = lead
        end = self._span.end(body[self._start :])
        if end is None:
            return PENDING
        used = self._start + end
        value = loads(body[self._start : used])
        if self._name is not None:
            args = arguments_text(value) if isinstance(value, dict) else None
            return Malformed(used) if args is None else Found((RawCall(self._name, args),), used)
        calls = [read_call(v, self._known) for v in (value if isinstance(value, list) else [value])]
        good = tuple(c for c in calls if c is not None)
        return Found(good, used) if good and len(good) == len(calls) else Malformed(used)

    def close(self, body: str) -> Found | Malformed:
        scan = self.push(body)
        return scan if isinstance(scan, Found | Malformed) else Malformed(0)


class MistralParser(ToolParser):
    markers = (TOOL_CALLS,)
    call_separator = ", "
    trigger = TOOL_CALLS

    def scanner(self, marker: str) -> CallScanner:
        return _Scanner(self.known)

    def write_call(self, call: ToolCall) -> str:
        return self.write_calls([call])

    def write_calls(self, calls: Sequence[ToolCall]) -> str:
        items = ", ".join(f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}' for c in calls)
        return f"{TOOL_CALLS} [{items}]"

    def call_shape(self) -> structural.CallShape:
        return structural.CallShape('{"name": "', '", "arguments": ', "}")

    def structural_tag(
        self,
        tools: Sequence[FunctionSpec],
        mode: structural.Mode,
        parallel: bool = True,
        function: str | None = None,
    ) -> dict[str, object]:
        """The calls are the items of one array after `[TOOL_CALLS] `: the array is the tag."""
        items = self.call_tags(tools, mode, function)
        inner = structural.calls_format(items, "", self.call_separator, "required", parallel)
        block: dict[str, object] = {"type": "tag", "begin": f"{TOOL_CALLS} [", "content": inner, "end": "]"}
        if mode != "auto":
            return structural.structural_tag(block)
        return structural.structural_tag(
            {"type": "triggered_tags", "triggers": [TOOL_CALLS], "tags": [block], "stop_after_first": True}
        )
