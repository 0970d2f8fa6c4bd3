"""Llama 3.1 / 3.2 JSON tool calls: a bare JSON object, optionally after `<|python_tag|>`.

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

A call opens at `<|python_tag|>` or at `{"name"` (also `{ "name"`) anywhere in the output, and
runs to the end of its JSON object; calls are separated by `;`. `"arguments"` is read as well
as `"parameters"`. An object with keys other than these is not a call, so JSON in ordinary
content stays content. Llama's code-interpreter form (`<|python_tag|>` then Python code) is not
a JSON call: it is content.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from radixserve.tools.base import ToolParser
from radixserve.tools.json_scan import JsonSpan, loads, read_call
from radixserve.tools.scan import PENDING, CallScanner, Found, Malformed, Scan
from radixserve.tools.structural import CallShape
from radixserve.tools.types import ToolCall

PYTHON_TAG = "<|python_tag|>"
OBJECT_MARKERS = ('{"name"', '{ "name"')


class _Scanner(CallScanner):
    """The JSON object after `<|python_tag|>` (`lead=""`), or the one a marker began (`lead`
    is the marker: the object's start)."""

    def __init__(self, lead: str, known: Collection[str]) -> None:
        self._lead = lead
        self._known = known
        self._span = JsonSpan()
        self._start: int | None = None  # where the object starts in `lead + body`

    def push(self, body: str) -> Scan:
        text = self._lead + body
        if self._start is None:
            stripped = text.lstrip()
            if not stripped:
                return PENDING
            if stripped[0] != "{":
                return Malformed(0)
            self._start = len(text) - len(stripped)
        end = self._span.end(text[self._start :])
        if end is None:
            return PENDING
        used = self._start + end - len(self._lead)
        call = read_call(loads(text[self._start : self._start + end]), self._known)
        return Malformed(used) if call is None else Found((call,), used)

    def close(self, body: str) -> Found | Malformed:
        scan = self.push(body)
        return scan if isinstance(scan, Found | Malformed) else Malformed(0)


class LlamaParser(ToolParser):
    markers = (PYTHON_TAG, *OBJECT_MARKERS)
    separators = ";"
    call_separator = "; "
    trigger = '{"name": '

    def scanner(self, marker: str) -> CallScanner:
        return _Scanner("" if marker == PYTHON_TAG else marker, self.known)

    def write_call(self, call: ToolCall) -> str:
        return f'{{"name": {json.dumps(call.name)}, "parameters": {call.arguments}}}'

    def call_shape(self) -> CallShape:
        return CallShape('{"name": "', '", "parameters": ', "}")
