"""Finding where a JSON value ends in streamed text, and reading a call object.

`JsonSpan` counts brackets outside strings, resuming where it stopped, so a call's arguments
streamed a token at a time are scanned once in all (not once per token).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from radixserve.tools.types import is_function_name

_OPEN = {"{": "}", "[": "]"}


class JsonSpan:
    """Where the object or array that starts at `text[0]` ends."""

    def __init__(self) -> None:
        self._pos = 0
        self._stack: list[str] = []
        self._in_string = False
        self._escaped = False

    def end(self, text: str) -> int | None:
        """The index just past the value in `text` (which only ever grows), or None if not yet
        closed. A closing bracket that does not match closes anyway: the value then fails
        `json.loads`, which is the caller's malformed case."""
        i = self._pos
        n = len(text)
        while i < n:
            c = text[i]
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in _OPEN:
                self._stack.append(_OPEN[c])
            elif c in "}]":
                if self._stack:
                    self._stack.pop()
                if not self._stack:
                    self._pos = i
                    return i
        self._pos = i
        return None


@dataclass(frozen=True)
class RawCall:
    """A call as read from the output, before it gets an id: `arguments` is JSON text."""

    name: str
    arguments: str


def loads(text: str) -> object:
    """JSON text -> its value, None when it is not JSON. Raw control characters inside strings
    are read (`strict=False`): a structural tag's length-bounded strings let a model write
    them (xgrammar), and the call's arguments are written back escaped."""
    try:
        return json.loads(text, strict=False)
    except (json.JSONDecodeError, RecursionError):
        return None


def arguments_text(args: object) -> str | None:
    """An arguments object (or JSON text of one, as some models write it) -> canonical JSON text."""
    if isinstance(args, str):
        args = loads(args)
    if not isinstance(args, dict):
        return None
    return json.dumps(args, ensure_ascii=False)


def read_call(obj: object, known: Collection[str] = ()) -> RawCall | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` -> a call; None when it is not one.

    Only these keys are allowed (a stray key means the text is likely not a call, which matters
    for formats without markup). Missing arguments are `{}`. With `known` non-empty, the name
    must be one of them."""
    if not isinstance(obj, dict) or not set(obj) <= {"name", "arguments", "parameters"}:
        return None
    name = obj.get("name")
    if not is_function_name(name) or (known and name not in known):
        return None
    assert isinstance(name, str)
    if "arguments" in obj and "parameters" in obj:
        return None
    args = arguments_text(obj.get("arguments", obj.get("parameters", {})))
    return None if args is None else RawCall(name, args)
