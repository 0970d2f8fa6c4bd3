"""The expressions a program appends to its state (`s += ...`).

Plain frozen data: the executor (`executor.py`) gives them meaning. `+` joins
expressions (and strings) into an `ExprList`, as in SGLang: `s += "A: " + gen("a")`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve.lang.choices import ChoicesMethod


class Expr:
    def __add__(self, other: Any) -> ExprList:
        return ExprList((*_items(self), *_items(as_expr(other))))

    def __radd__(self, other: Any) -> ExprList:
        return ExprList((*_items(as_expr(other)), *_items(self)))


def as_expr(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    if x is None:
        raise ValueError("tried to append None to a program state")
    raise TypeError(f"cannot append {type(x).__name__} to a program state (use str or an expression)")


def _items(e: Expr) -> tuple[Expr, ...]:
    return e.items if isinstance(e, ExprList) else (e,)


@dataclass(frozen=True)
class Text(Expr):
    value: str


@dataclass(frozen=True)
class ExprList(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Gen(Expr):
    name: str | None
    overrides: dict[str, Any] = field(default_factory=dict)  # the gen() arguments that were given
    dtype: Any = None  # int, float, str or their names


@dataclass(frozen=True)
class Select(Expr):
    name: str | None
    choices: Sequence[str]
    temperature: float
    method: ChoicesMethod


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class CachePrefix(Expr):
    """Prefill the state's text so far into the prefix cache (fork does it for its branches)."""


@dataclass(frozen=True)
class Concat(Expr):
    """Append the text each of `states` produced since the fork (join(mode='concate_and_append'))."""

    states: tuple[Any, ...]


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    name: str
