"""Hermes / Qwen2.5 / Qwen3 tool calls: each call a JSON object inside `<tool_call>` tags.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The newlines are optional when reading. A call runs to the first `</tool_call>`; an output that
ends inside a call (the closing tag was a stop string) still holds the call if its JSON is
complete.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from radixserve.tools.base import ToolParser
from radixserve.tools.json_scan import loads, read_call
from radixserve.tools.scan import PENDING, CallScanner, Found, Malformed, Scan
from radixserve.tools.structural import CallShape
from radixserve.tools.types import ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class _Scanner(CallScanner):
    def __init__(self, known: Collection[str]) -> None:
        self._known = known
        self._from = 0  # where `CLOSE` may start, for the next search

    def _decide(self, inner: str, used: int) -> Found | Malformed:
        call = read_call(loads(inner), self._known)
        return Malformed(used) if call is None else Found((call,), used)

    def push(self, body: str) -> Scan:
        j = body.find(CLOSE, self._from)
        if j < 0:
            self._from = max(0, len(body) - len(CLOSE) + 1)
            return PENDING
        return self._decide(body[:j], j + len(CLOSE))

    def close(self, body: str) -> Found | Malformed:
        scan = self.push(body)
        if isinstance(scan, Found | Malformed):
            return scan
        return self._decide(body, len(body))


class HermesParser(ToolParser):
    markers = (OPEN,)
    trigger = OPEN

    def scanner(self, marker: str) -> CallScanner:
        return _Scanner(self.known)

    def write_call(self, call: ToolCall) -> str:
        return f'{OPEN}\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}\n{CLOSE}'

    def call_shape(self) -> CallShape:
        return CallShape(f'{OPEN}\n{{"name": "', '", "arguments": ', f"}}\n{CLOSE}")
