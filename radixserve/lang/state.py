"""`ProgramState` (the `s` of a program) and `ProgramStateGroup` (what `s.fork(n)` returns)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal, overload

from radixserve.lang.executor import Executor, ProgramError, check_running, wait_future
from radixserve.lang.ir import (
    CachePrefix,
    Concat,
    Expr,
    ExprList,
    RoleBegin,
    RoleEnd,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
)


class ProgramState:
    """The text, variables and messages of one (branch of a) program."""

    def __init__(self, executor: Executor) -> None:
        self._exec = executor
        self.ret_value: Any = None

    # ---- building ------------------------------------------------------------------------

    def __iadd__(self, other: Any) -> ProgramState:
        self._exec.submit(as_expr(other))
        return self

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            e = ExprList((RoleBegin(role), as_expr(expr), RoleEnd(role)))
            self._exec.submit(e)
            return e

        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            self._exec.submit(RoleBegin(role))
            yield
            self._exec.submit(RoleEnd(role))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes the variable `name`."""
        self._exec.submit(VarScopeBegin(name))
        yield
        self._exec.submit(VarScopeEnd(name))

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """`size` branches that start from this state's text; with two or more, the shared
        text is prefilled into the prefix cache first so the branches only compute their own."""
        size = int(size)
        if size < 1:
            raise ValueError(f"fork(size={size}): need at least one branch")
        ex = self._exec
        if size > 1:
            ex.submit(CachePrefix())
        self.sync()
        states = []
        for _ in range(size):
            child = Executor(ex.backend, ex.loop, ex.defaults, ex.template, ex.stream, ex.on_new)
            child.text, child.fork_start = ex.text, len(ex.text)
            child.variables, child.messages = dict(ex.variables), list(ex.messages)
            child.vars_done = set(ex.vars_done)
            child.cur_role, child.role_begin = ex.cur_role, ex.role_begin
            states.append(ProgramState(child))
        return ProgramStateGroup(states, self)

    # ---- reading -------------------------------------------------------------------------

    async def finished(self) -> None:
        """For async code: wait until the program (this branch) has finished; then reading
        it (text(), error(), variables) never blocks."""
        await self._exec.finished()

    def sync(self) -> None:
        """Wait until everything appended so far has run."""
        self._exec.wait()

    def _check(self) -> None:
        err = self._exec.error
        if err is not None:
            raise ProgramError(f"the program failed: {err!r}", self) from err

    def text(self) -> str:
        self.sync()
        return self._exec.text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return list(self._exec.messages)

    def error(self) -> BaseException | None:
        """The exception that stopped the program (None while it runs fine or when done)."""
        self.sync()
        return self._exec.error

    def get_var(self, name: str) -> Any:
        self.sync()
        self._exec.wait_for_name(name, self._exec.variables)
        if name not in self._exec.variables:
            self._check()
            raise KeyError(f"the program has no variable {name!r}")
        return self._exec.variables[name]

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self._exec.variables[name] = value

    def get_meta_info(self, name: str) -> Any:
        """prompt_tokens, completion_tokens, cached_tokens, finish_reason (and logprobs when
        asked) of the gen or select that set `name`."""
        self.sync()
        self._exec.wait_for_name(name, self._exec.meta)
        if name not in self._exec.meta:
            self._check()
            raise KeyError(f"the program has no gen or select named {name!r}")
        return self._exec.meta[name]

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._exec.variables

    def __repr__(self) -> str:
        return f"ProgramState({self._exec.text!r})"

    # ---- streaming -----------------------------------------------------------------------

    def _snapshot(self, var: str | None) -> tuple[str, bool]:
        ex = self._exec
        with ex.cv:
            if var is None:
                return ex.text, ex.done.done()
            value = ex.variables.get(var, "")
            return (value if isinstance(value, str) else ""), var in ex.vars_done or ex.done.done()

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text (or one variable) as it grows, piece by piece, until it is complete.
        Without stream=True the pieces come one per gen/select."""
        ex = self._exec
        prev, seen = 0, -1
        while True:
            with ex.cv:
                while ex.version == seen:
                    ex.cv.wait(0.5)
                    check_running(ex.loop)
                seen = ex.version
            cur, finished = self._snapshot(var_name)
            if len(cur) > prev:
                yield cur[prev:]
                prev = len(cur)
            if finished:
                return

    @overload
    def text_async_iter(
        self, var_name: str | None = None, return_meta_data: Literal[False] = False
    ) -> AsyncIterator[str]: ...

    @overload
    def text_async_iter(
        self, var_name: str, return_meta_data: Literal[True]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[str | tuple[str, dict[str, Any]]]:
        """`text_iter` for async code, from any event loop. With `return_meta_data` (SGLang's
        argument; needs `var_name`) each piece comes as `(text, meta_info)`: for a streamed gen
        the meta_info so far (completion_tokens, ...) whose `output_token_logprobs` (and
        `output_top_logprobs`) are those of this piece's tokens, with
        `output_token_logprobs_length` the count so far; otherwise the variable's meta_info."""
        if return_meta_data and var_name is None:
            raise ValueError("text_async_iter(return_meta_data=True) needs a variable name")
        ex = self._exec
        ev = asyncio.Event()
        ex.add_listener(asyncio.get_running_loop(), ev)
        prev = sent_lps = 0
        try:
            while True:
                ev.clear()
                with ex.cv:  # the text and its meta_info in one snapshot
                    cur, finished = self._snapshot(var_name)
                    meta = self._meta_snapshot(var_name) if return_meta_data and var_name else None
                if len(cur) > prev:
                    piece, prev = cur[prev:], len(cur)
                    if meta is None:
                        yield piece
                    else:
                        info, sent_lps = _piece_meta(*meta, sent_lps)
                        yield piece, info
                if finished:
                    return
                await ev.wait()
        finally:
            ex.remove_listener(ev)

    def _meta_snapshot(self, var: str) -> tuple[dict[str, Any], bool]:
        """The variable's meta_info now, and whether it is a streamed gen's (cumulative)."""
        ex = self._exec
        if var in ex.stream_meta:
            return dict(ex.stream_meta[var]), True
        return dict(ex.meta.get(var) or {}), False

    def __aiter__(self) -> AsyncIterator[str]:
        return self.text_async_iter()


_INCREMENTAL = ("output_token_logprobs", "output_top_logprobs")  # per piece, as SGLang streams them


def _piece_meta(meta: dict[str, Any], streamed: bool, sent: int) -> tuple[dict[str, Any], int]:
    """A streamed gen's cumulative meta_info cut to one piece: its logprobs are those after
    the first `sent` tokens. Returns it and the new count sent."""
    if not streamed or "output_token_logprobs" not in meta:
        return meta, sent
    total = len(meta["output_token_logprobs"])
    for key in _INCREMENTAL:
        if key in meta:
            meta[key] = meta[key][sent:]
    meta["output_token_logprobs_length"] = total
    return meta, total


class ProgramStateGroup:
    """The branches of a fork: `forks[i]`, `forks += expr` (or a list, or `lambda i: ...`)."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if value is not self.states[i]:
            raise ValueError("a fork's branches cannot be replaced")

    def __iadd__(self, other: Expr | str | list[Any] | Callable[[int], Any]) -> ProgramStateGroup:
        for i, st in enumerate(self.states):
            if isinstance(other, (list, tuple)):
                st += other[i]
            elif callable(other) and not isinstance(other, Expr):
                st += other(i)
            else:
                st += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for the branches. gather_variable: each variable a branch made becomes a
        list in the parent; concate_and_append: the branches' new text is appended too."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"join(mode={mode!r}): use gather_variable or concate_and_append")
        for st in self.states:
            st._exec.end()
        if mode == "concate_and_append":
            self.parent._exec.submit(Concat(tuple(self.states)))
            self.parent.sync()
            return
        for st in self.states:
            wait_future(st._exec.done, st._exec.loop)
        parent = self.parent._exec
        parent.wait()
        with parent.cv:
            before = set(parent.variables)
            for st in self.states:
                for k in st._exec.variables.keys() - before:
                    parent.variables.setdefault(k, []).append(st._exec.variables[k])
                    if k in st._exec.meta:
                        parent.meta.setdefault(k, []).append(st._exec.meta[k])
        parent._changed()
