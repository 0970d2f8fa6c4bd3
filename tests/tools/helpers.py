"""Shared by the tool-parser tests: calls without their random ids, and streaming by cuts."""

from __future__ import annotations

from collections.abc import Iterable

from radixserve.tools import ParsedText, TextDelta, ToolParser, assemble


def calls_of(parsed: ParsedText) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in parsed.tool_calls]


def cut(text: str, cuts: Iterable[int]) -> list[str]:
    points = sorted({0, len(text), *(min(max(c, 0), len(text)) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def stream_deltas(parser: ToolParser, pieces: Iterable[str]) -> list[TextDelta]:
    s = parser.stream()
    return [*(s.feed(p) for p in pieces), s.finish()]


def streamed(parser: ToolParser, pieces: Iterable[str]) -> ParsedText:
    return assemble(stream_deltas(parser, pieces))
