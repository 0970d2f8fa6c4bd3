"""Find the regex features xgrammar cannot enforce: lookaround and backreferences.

xgrammar (0.2.x) compiles a regex to a grammar and silently drops what it cannot
express, so a `pattern` with `(?=...)` would let through outputs that break the
schema. Those patterns are refused instead (`unenforceable`).

This is a small scanner rather than Python's `re._parser`: that parser is
private, and it reads Python's dialect, while JSON Schema patterns are
ECMA-262 (`(?<name>...)` groups and `\\k<name>` backreferences, which Python
rejects or misreads). The scanner only has to know escapes (`\\(` is a
character) and character classes (`[(?=]` is three characters), the two
places where the markers below are not what they look like.
"""

from __future__ import annotations

_LOOKAROUND = {
    "(?=": "a lookahead `(?=`",
    "(?!": "a negative lookahead `(?!`",
    "(?<=": "a lookbehind `(?<=`",
    "(?<!": "a negative lookbehind `(?<!`",
    "(?P=": "a backreference `(?P=name)`",
}


def unenforceable(pattern: str) -> str | None:
    """The first feature of `pattern` that xgrammar would ignore (described), or None."""
    i, n = 0, len(pattern)
    in_class = False
    body = 0  # where the class's characters start (after "[" or "[^")
    while i < n:
        c = pattern[i]
        if c == "\\":  # an escape: the next character is never special
            nxt = pattern[i + 1] if i + 1 < n else ""
            if not in_class and nxt in "123456789":
                return f"a backreference `\\{nxt}`"
            if not in_class and nxt == "k" and pattern.startswith("<", i + 2):
                return "a backreference `\\k<name>`"
            i += 2
            continue
        if in_class:
            # "[]" and "[^]" open with a literal "]" in most dialects; read it as a character.
            in_class = c != "]" or i == body
            i += 1
            continue
        if c == "[":
            in_class = True
            i += 2 if pattern.startswith("[^", i) else 1
            body = i
            continue
        if c == "(":
            for marker, what in _LOOKAROUND.items():
                if pattern.startswith(marker, i):
                    return what
        i += 1
    return None
