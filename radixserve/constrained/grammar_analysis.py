"""Static facts about a grammar, read from xgrammar's EBNF text (`str(xgr.Grammar)`).

For each rule, the length of the shortest string it derives (a fixpoint over
the rules; infinite when it derives none: a rule whose every alternative
recurses, like `n ::= "{" "\\"next\\": " n "}"`, the grammar of an object that
always requires another one). Two uses:

- a grammar whose root derives no finite string (`admits_output` False) can
  only be decoded until max_tokens, so its request fails at compile time;
- jump-forward (xgrammar's `find_jump_forward_string`) follows the forced
  path through the grammar and never returns when that path is infinite: it
  loops, holding the GIL, growing memory. That happens only after entering a
  rule with no finite derivation, so `jump_safe` holds when every rule
  reachable from the root derives a finite string, and the longest of those
  shortest strings is at most `MAX_FORCED` (a forced string is a prefix of
  every completion, so it is no longer than the shortest one; this bound
  also keeps out grammars that double a rule's length level by level).
  Recursion with a base case (`[0-9]+`, JSON values, optional `next` links)
  is fine.

The EBNF text is xgrammar's printed form of a parsed grammar (normalized:
rules `name ::= body`, one a line, a lookahead `(=...)` after the body).
Anything this reader does not know makes `analyze` return None, and the
caller then treats the grammar as unsafe for jump-forward (never as wrong).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_FORCED = 1 << 16  # bytes: the longest shortest-derivation a jump-safe rule may have

# An expression: ("lit", n) n bytes; ("ref", name); ("seq", [e...]); ("alt", [e...]);
# ("rep", e, lo) e at least lo times. Min lengths only, so upper bounds are dropped.
Expr = tuple  # type: ignore[type-arg]

# Rule names keep the characters of `$defs` names (`definitions_SubObject.ebeaf`, `a-b`).
_RULE = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.\-]*) ::= (.*)")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(-?\d+)?\s*)?\}")
_TERMINAL_FUNCTIONS = ("Regex",)  # elements that match a string by themselves


class _Unknown(Exception):
    """A construct this reader does not know."""


@dataclass(frozen=True)
class GrammarFacts:
    shortest: float  # bytes of the root's shortest output (math.inf: it has none)
    jump_safe: bool

    @property
    def admits_output(self) -> bool:
        return self.shortest < math.inf


def analyze(ebnf: str, root: str = "root") -> GrammarFacts | None:
    """The facts of a grammar in xgrammar's printed EBNF; None if it cannot be read."""
    try:
        rules = {name: _Parser(body).rule() for name, body in _rules(ebnf)}
        if root not in rules:
            return None
        refs = {name: _refs(expr) for name, expr in rules.items()}
        if any(r not in rules for rs in refs.values() for r in rs):
            return None
        length = _shortest(rules, refs)
    except (_Unknown, RecursionError):
        return None
    worst = max(length[r] for r in _reachable(root, refs))
    return GrammarFacts(length[root], worst <= MAX_FORCED)


def _rules(ebnf: str) -> list[tuple[str, str]]:
    out = []
    for line in ebnf.splitlines():
        if not line.strip():
            continue
        m = _RULE.fullmatch(line.strip())
        if m is None:
            raise _Unknown(line[:80])
        out.append((m.group(1), m.group(2)))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def rule(self) -> Expr:
        body = self.choice()
        self.ws()
        while self.s.startswith("(=", self.i):  # the rule's lookahead: matches no output
            self.group()
            self.ws()
        if self.i != len(self.s):
            raise _Unknown(self.s[self.i : self.i + 20])
        return body

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1

    def choice(self) -> Expr:
        alts = [self.sequence()]
        self.ws()
        while self.s.startswith("|", self.i):
            self.i += 1
            alts.append(self.sequence())
            self.ws()
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def sequence(self) -> Expr:
        items: list[Expr] = []
        while True:
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] in "|)" or self.s.startswith("(=", self.i):
                break
            items.append(self.postfix(self.element()))
        return items[0] if len(items) == 1 else ("seq", items)

    def element(self) -> Expr:
        c = self.s[self.i]
        if c == '"':
            return ("lit", self.string())
        if c == "[":
            self.char_class()
            return ("lit", 1)
        if c == "(":
            return self.group()
        m = _NAME.match(self.s, self.i)
        if m is None:
            raise _Unknown(self.s[self.i : self.i + 20])
        self.i = m.end()
        if self.s.startswith("(", self.i):  # a function element: Regex("...", json_string=true)
            if m.group() not in _TERMINAL_FUNCTIONS:
                raise _Unknown(m.group())
            self.call_args()
            return ("lit", 0)
        return ("ref", m.group())

    def group(self) -> Expr:
        self.i += 2 if self.s.startswith("(=", self.i) else 1
        inner = self.choice()
        self.ws()
        if not self.s.startswith(")", self.i):
            raise _Unknown("unclosed group")
        self.i += 1
        return inner

    def postfix(self, e: Expr) -> Expr:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in "*?":
                e, self.i = ("rep", e, 0), self.i + 1
            elif c == "+":
                e, self.i = ("rep", e, 1), self.i + 1
            elif c == "{":
                m = _REPEAT.match(self.s, self.i)
                if m is None:
                    raise _Unknown(self.s[self.i : self.i + 20])
                e, self.i = ("rep", e, int(m.group(1))), m.end()
            else:
                break
        return e

    def string(self) -> int:
        """Skip a string literal; its length in characters (an escape counts as one)."""
        i, n, count = self.i + 1, len(self.s), 0
        while i < n and self.s[i] != '"':
            i += 2 if self.s[i] == "\\" else 1
            count += 1
        if i >= n:
            raise _Unknown("unclosed string")
        self.i = i + 1
        return count

    def char_class(self) -> None:
        i, n = self.i + 1, len(self.s)
        while i < n and self.s[i] != "]":
            i += 2 if self.s[i] == "\\" else 1
        if i >= n:
            raise _Unknown("unclosed class")
        self.i = i + 1

    def call_args(self) -> None:
        depth, i, n = 0, self.i, len(self.s)
        while i < n:
            c = self.s[i]
            if c == '"':
                self.i = i
                self.string()
                i = self.i
                continue
            depth += {"(": 1, ")": -1}.get(c, 0)
            i += 1
            if depth == 0:
                self.i = i
                return
        raise _Unknown("unclosed call")


def _refs(e: Expr) -> set[str]:
    out: set[str] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if x[0] == "ref":
            out.add(x[1])
        elif x[0] in ("seq", "alt"):
            stack.extend(x[1])
        elif x[0] == "rep":
            stack.append(x[1])
    return out


def _length(e: Expr, known: dict[str, float]) -> float:
    kind = e[0]
    if kind == "lit":
        return float(e[1])
    if kind == "ref":
        return known[e[1]]
    if kind == "seq":
        return sum((_length(x, known) for x in e[1]), 0.0)
    if kind == "alt":
        return min(_length(x, known) for x in e[1])
    return 0.0 if e[2] == 0 else e[2] * _length(e[1], known)


def _shortest(rules: dict[str, Expr], refs: dict[str, set[str]]) -> dict[str, float]:
    """Each rule's shortest derivation: component by component, dependencies first; inside a
    cycle, rounds until nothing changes (a shortest derivation repeats no rule on a path, so
    |component| + 1 rounds are enough)."""
    known = {name: math.inf for name in rules}
    for component in _components(refs):
        for _ in range(len(component) + 1):
            changed = False
            for name in component:
                v = _length(rules[name], known)
                if v < known[name]:
                    known[name], changed = v, True
            if not changed:
                break
    return known


def _components(refs: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components, each after those it refers to (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in refs:
        if start in index:
            continue
        work = [(start, iter(sorted(refs[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(refs[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    component.append(x)
                    if x == node:
                        break
                out.append(component)
    return out


def _reachable(root: str, refs: dict[str, set[str]]) -> set[str]:
    seen, todo = {root}, [root]
    while todo:
        for r in refs[todo.pop()]:
            if r not in seen:
                seen.add(r)
                todo.append(r)
    return seen
