"""`ToolStream`: one output's text, fed piece by piece, split into content and call deltas.

Text outside calls is content, except whitespace touching a call (before it, and after it up to
the next text, with the format's separators such as Llama's `;`). Where calls stand between two
pieces of content, the whitespace before the first of them is kept to join the two. So streamed
content holds back trailing whitespace until the next non-space or the end, and holds back a
possible start of an opening marker (`<tool_` ...) until it is decided: markup never reaches
content, unless the call turns out malformed, and then all of its text is content, exactly as
`parse` returns it.

A call is sent when it is complete: a first delta with index, id and name (and empty
arguments), then one delta with all of its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixserve.tools.scan import CallScanner, Found, Pending
from radixserve.tools.types import TextDelta, ToolCallDelta, new_call_id


def find_marker(text: str, markers: Sequence[str], final: bool) -> tuple[int, str | None]:
    """(start, marker) of the first opening marker in `text`; (start, None) when none is there,
    `start` being where a possible marker begins at the end of the text (its length if none, or
    when `final`: no more text will come)."""
    found: tuple[int, str] | None = None
    for m in markers:
        i = text.find(m)
        if i >= 0 and (found is None or i < found[0] or (i == found[0] and len(m) > len(found[1]))):
            found = (i, m)
    hold = len(text)
    if not final:
        for m in markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    hold = min(hold, len(text) - k)
                    break
    if found is not None and found[0] <= hold:
        return found
    return hold, None


class ToolStream:
    """A streaming session of one output (`ToolParser.stream()`): `feed` pieces, then `finish`."""

    def __init__(
        self, markers: Sequence[str], new_scanner: Callable[[str], CallScanner], separators: str = ""
    ) -> None:
        self._markers = tuple(markers)
        self._new_scanner = new_scanner
        self._skip = separators + " \t\r\n"  # not content after a call
        self._buf = ""  # text not yet decided; in a call, the text after its marker
        self._marker = ""
        self._scanner: CallScanner | None = None
        self._space = ""  # trailing whitespace of content, dropped if a call follows
        self._join = ""  # whitespace before calls that follow content: kept if content follows
        self._wrote = False  # some content was sent
        self._after_call = False
        self._calls = 0
        self._finished = False

    def feed(self, piece: str) -> TextDelta:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += piece
        return self._run(final=False)

    def finish(self) -> TextDelta:
        """The output ended: what was held back is decided (an unfinished call is content)."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._run(final=True)

    def _run(self, final: bool) -> TextDelta:
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while True:
            if self._scanner is not None:
                scan = self._scanner.close(self._buf) if final else self._scanner.push(self._buf)
                if isinstance(scan, Pending):
                    break
                if isinstance(scan, Found):
                    if self._wrote and not self._join:
                        self._join = self._space
                    self._space = ""
                    for call in scan.calls:
                        deltas.append(ToolCallDelta(self._calls, new_call_id(), call.name, ""))
                        deltas.append(ToolCallDelta(self._calls, None, None, call.arguments))
                        self._calls += 1
                    self._after_call = True
                else:
                    content.append(self._space + self._marker + self._buf[: scan.used])
                    self._space = ""
                    self._wrote = True
                self._buf = self._buf[scan.used :]
                self._scanner = None
                continue
            if self._after_call:
                rest = self._buf.lstrip(self._skip)
                self._buf = rest
                if not rest:
                    break
                self._after_call = False
                self._space, self._join = self._join, ""
            start, marker = find_marker(self._buf, self._markers, final)
            text = self._space + self._buf[:start]
            if marker is None and final:
                content.append(text)
                self._space = self._buf = ""
                break
            kept = text.rstrip()
            content.append(kept)
            self._wrote = self._wrote or bool(kept)
            self._space = text[len(kept) :]
            if marker is None:
                self._buf = self._buf[start:]
                break
            self._marker = marker
            self._scanner = self._new_scanner(marker)
            self._buf = self._buf[start + len(marker) :]
        return TextDelta("".join(content), tuple(deltas))
