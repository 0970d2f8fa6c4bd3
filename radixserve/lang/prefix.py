"""The constant prefix of a batch of programs, found by running each body up to its
first gen/select with a recording state (SGLang traces programs the same way).

`run_batch` prefills that prefix once before the programs fan out, so all of them
find it in the radix cache instead of racing to compute it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from radixserve.lang.chat_template import ChatTemplate
from radixserve.lang.ir import Expr, ExprList, RoleBegin, RoleEnd, Text, VarScopeBegin, VarScopeEnd, as_expr

MIN_PREFIX_CHARS = 64  # shorter prefixes are not worth a request of their own


class _Stop(Exception):
    pass


class _Recorder:
    """Stands in for a ProgramState and records its constant text until the first call."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.text = ""
        self.role: str | None = None
        self.had_role = False

    def _add(self, e: Expr) -> None:
        if isinstance(e, Text):
            self.text += e.value
        elif isinstance(e, ExprList):
            for x in e.items:
                self._add(x)
        elif isinstance(e, RoleBegin):
            first = not self.had_role and not self.text
            self.text += self.template.prefix(e.role, first)
            self.role, self.had_role = e.role, True
        elif isinstance(e, RoleEnd):
            self.text += self.template.suffix(e.role)
            self.role = None
        elif not isinstance(e, (VarScopeBegin, VarScopeEnd)):
            raise _Stop

    def __iadd__(self, other: Any) -> _Recorder:
        self._add(as_expr(other))
        return self

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self._add(ExprList((RoleBegin(role), as_expr(expr), RoleEnd(role))))
            return None

        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            self._add(RoleBegin(role))
            yield
            self._add(RoleEnd(role))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        yield

    def __getattr__(self, name: str) -> Any:
        raise _Stop  # reading the state (s["x"], fork, text()) ends the constant part


def traced_prefix(func: Callable[..., Any], kwargs: dict[str, Any], template: ChatTemplate) -> str:
    rec = _Recorder(template)
    with contextlib.suppress(Exception):
        func(rec, **kwargs)
    return rec.text


def common_prefix(func: Callable[..., Any], batch: Sequence[dict[str, Any]], template: ChatTemplate) -> str:
    """The text every program of `batch` starts with, cut after its last newline (so the
    tokens at the cut are the same as in each program's full text); "" when too short."""
    texts = [traced_prefix(func, kw, template) for kw in batch]
    prefix = os.path.commonprefix(texts) if texts else ""
    cut = prefix.rfind("\n")
    prefix = prefix[: cut + 1] if cut >= 0 else ""
    return prefix if len(prefix) >= MIN_PREFIX_CHARS else ""
