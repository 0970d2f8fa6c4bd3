"""Reasoning blocks (`<think>...</think>`) split from the answer, whole or streamed.

Two families: Qwen3 writes `<think>` itself at the start of its output; DeepSeek-R1's template
ends the prompt with `<think>`, so the output starts inside the block and only `</think>` shows.
A Qwen3 prompt can open the block too; `reasoning_parser(name, prompt=...)` reads that from the
prompt (DeepSeek-R1 always starts inside: its older template leaves the tag to the model, which
may not write it). The start tag counts only at the very start of the output (after whitespace; inside an
opened block, a repeated start tag there is dropped); text after the block is content.

Reasoning is given without its surrounding whitespace, and content without the whitespace that
follows `</think>`; so a stream holds back trailing whitespace of reasoning until more comes, and
a possible start of a tag until it is decided. An output that ends inside the block is all
reasoning. Every split of an output into pieces gives the same text as `parse`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    start: str = "<think>"
    end: str = "</think>"
    starts_inside: bool = False  # the output starts inside the block, whatever the prompt


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str = ""
    content: str = ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningStream:
    def __init__(self, fmt: ReasoningFormat) -> None:
        self._fmt = fmt
        # "start" -> "inside" -> "after" (the end tag) -> "content"; or "start" -> "content"
        self._state = "inside" if fmt.starts_inside else "start"
        self._buf = ""
        self._lead = True  # inside, nothing sent yet: leading whitespace is dropped
        self._finished = False

    def feed(self, piece: str) -> ReasoningSplit:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += piece
        return self._run(final=False)

    def finish(self) -> ReasoningSplit:
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._run(final=True)

    def _run(self, final: bool) -> ReasoningSplit:
        reasoning = ""
        content = ""
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(self._fmt.start):
                self._state = "inside"
                self._buf = head[len(self._fmt.start) :]
            elif final or not (not head or self._fmt.start.startswith(head)):
                self._state = "content"
            else:
                return ReasoningSplit()
        if self._state == "inside":
            while self._lead:  # leading whitespace, and a start tag the model repeats, are dropped
                self._buf = self._buf.lstrip()
                if self._buf.startswith(self._fmt.start):
                    self._buf = self._buf[len(self._fmt.start) :]
                    continue
                if not final and self._fmt.start.startswith(self._buf):  # empty, or a start of it
                    return ReasoningSplit()
                self._lead = False
            j = self._buf.find(self._fmt.end)
            if j >= 0:
                reasoning = self._buf[:j].rstrip()
                self._buf = self._buf[j + len(self._fmt.end) :]
                self._state = "after"
            elif final:
                reasoning, self._buf = self._buf.rstrip(), ""
            else:
                keep = len(self._buf) - _partial_suffix(self._buf, self._fmt.end)
                sent = self._buf[:keep].rstrip()
                reasoning, self._buf = sent, self._buf[len(sent) :]
        if self._state == "after":  # whitespace after the end tag is not content
            self._buf = self._buf.lstrip()
            if self._buf:
                self._state = "content"
        if self._state == "content":
            content, self._buf = self._buf, ""
        return ReasoningSplit(reasoning, content)


class ReasoningParser:
    def __init__(self, fmt: ReasoningFormat = ReasoningFormat()) -> None:
        self.format = fmt

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.format)

    def parse(self, text: str) -> ReasoningSplit:
        s = self.stream()
        a, b = s.feed(text), s.finish()
        return ReasoningSplit(a.reasoning + b.reasoning, a.content + b.content)


def prompt_opens(prompt: str, fmt: ReasoningFormat) -> bool:
    """Whether the prompt ends inside an opened reasoning block (`...<think>\\n`)."""
    return prompt.rfind(fmt.start) > prompt.rfind(fmt.end)


_FORMATS: dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat(),
    "deepseek-r1": ReasoningFormat(starts_inside=True),
}


def reasoning_parser_names() -> tuple[str, ...]:
    return tuple(sorted(_FORMATS))


def reasoning_parser(name: str, prompt: str | None = None) -> ReasoningParser:
    """The parser of family `name`; with the rendered `prompt`, the output also starts inside
    the block when the prompt opens it."""
    fmt = _FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"reasoning parser {name!r}: not one of {reasoning_parser_names()}")
    if prompt is not None:
        fmt = ReasoningFormat(fmt.start, fmt.end, fmt.starts_inside or prompt_opens(prompt, fmt))
    return ReasoningParser(fmt)


def detect_reasoning_parser(chat_template: str) -> str | None:
    """The reasoning parser for a chat template that mentions `<think>`; None otherwise."""
    if "<think>" not in chat_template:
        return None
    return "deepseek-r1" if "<｜Assistant｜>" in chat_template else "qwen3"


def register_reasoning_parser(name: str, fmt: ReasoningFormat, replace: bool = False) -> None:
    """Make `reasoning_parser(name)` use `fmt`; a taken name needs `replace=True`."""
    if not name or not isinstance(name, str):
        raise ValueError("reasoning parser name: must be a non-empty string")
    if not fmt.start or not fmt.end:
        raise ValueError(f"reasoning parser {name!r}: start and end tags must be non-empty")
    if name in _FORMATS and not replace:
        raise ValueError(f"reasoning parser {name!r}: already registered (pass replace=True)")
    _FORMATS[name] = fmt
