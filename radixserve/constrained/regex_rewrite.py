"""Regex rewrites that work around xgrammar's regex converter.

xgrammar (0.2.x) reads an optional group whose body ends in a repeat as if
the parts were optional on their own: `x(ab*)?` accepts `xb`, and the URL
path pattern `^/([a-z]+(/[a-z]*)*)?$` accepts `//`. The same group written as
an alternation with the empty string, `x(ab*|)`, is converted correctly, and
it matches exactly the same strings, so every `(...)?` becomes `(...|)`.
"""

from __future__ import annotations


def optional_groups(pattern: str) -> str:
    """`(...)?` -> `(...|)` outside character classes; lazy/possessive `??`, `?+` untouched."""
    out: list[str] = []
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:  # an escape: two characters, never special
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]" or (bool(out) and out[-1] in ("[", "[^"))  # "[]" opens with a literal ]
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append("[^" if pattern.startswith("[^", i) else "[")
            i += 2 if pattern.startswith("[^", i) else 1
            continue
        if c == ")" and pattern.startswith("?", i + 1) and not pattern.startswith(("??", "?+"), i + 1):
            out.append("|)")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)
