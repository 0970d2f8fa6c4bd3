"""Runs one program state's expressions, in order, as a task on the backend's loop.

The program body (plain Python, in the caller's or a worker thread) only
enqueues expressions; reading a variable or the text waits until what was
enqueued before it is done. So forks run concurrently (one task each), and a
body that never reads mid-way costs no thread switches per call.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

from radixserve.lang.backend import Backend, GenParams
from radixserve.lang.chat_template import ChatTemplate
from radixserve.lang.choices import decide
from radixserve.lang.ir import (
    CachePrefix,
    Concat,
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)

_END = object()


class _InBody(threading.local):
    active = False  # True in a thread while it runs a program's body


IN_BODY = _InBody()
_DTYPES = {int: "int", float: "float", str: "str", bool: "bool", "int": "int", "float": "float"}
_DTYPES.update({"str": "str", "bool": "bool"})


class ProgramError(RuntimeError):
    """A program failed: a bad parameter, a failed request or an exception in its code.
    `state` is the program's state (its text so far); `__cause__` the original error."""

    def __init__(self, msg: str, state: Any = None) -> None:
        super().__init__(msg)
        self.state = state


class Executor:
    def __init__(
        self,
        backend: Backend,
        loop: asyncio.AbstractEventLoop,
        defaults: GenParams,
        template: ChatTemplate,
        stream: bool,
        on_new: Callable[[Executor], None] | None = None,
    ) -> None:
        self.backend, self.loop, self.defaults, self.template = backend, loop, defaults, template
        self.stream = stream
        self.text = ""
        self.variables: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        # A streamed gen's meta_info so far (cumulative: completion_tokens, output logprobs),
        # set with its text in one step so streaming readers see the two agree.
        self.stream_meta: dict[str, dict[str, Any]] = {}
        self.messages: list[dict[str, str]] = []
        self.cur_role: str | None = None
        self.role_begin = 0
        self.scopes: dict[str, int] = {}
        self.fork_start = 0
        self.error: BaseException | None = None
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.cv = threading.Condition()
        self.submitted = 0
        self.completed = 0
        self.version = 0  # bumped on every change of text or a variable (streaming readers)
        self.vars_done: set[str] = set()
        self.ended = False
        self._queue: collections.deque[Any] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.on_new = on_new  # the program keeps every executor of its forks to wait for them
        if on_new is not None:
            on_new(self)
        loop.call_soon_threadsafe(self._start)

    # ---- called from any thread ------------------------------------------------------------

    def submit(self, expr: Any) -> None:
        with self.cv:
            if self.ended:
                raise RuntimeError("this program state has ended (joined or finished)")
            self.submitted += expr is not _END
            self.ended = expr is _END
        self.loop.call_soon_threadsafe(self._push, expr)

    def end(self) -> None:
        with self.cv:
            if self.ended:
                return
        self.submit(_END)

    def wait(self) -> None:
        """Block until everything submitted so far is done (never call it on the loop's thread)."""
        target = self.submitted
        if self.completed >= target or self.done.done():
            return
        if _on_loop_thread(self.loop):
            raise RuntimeError(
                "a program state was read inside the event loop that runs it; "
                "read it after `await fn.arun(...)` or `await state.finished()`, or from its own body"
            )
        with self.cv:
            while not (self.completed >= target or self.done.done()):
                # Woken on every change; the timeout only notices a loop that stopped under us.
                self.cv.wait(0.5)
                check_running(self.loop)

    async def finished(self) -> None:
        """Wait, from any event loop, until the state has ended and all its work is done."""
        await asyncio.wrap_future(self.done)

    def add_listener(self, loop: asyncio.AbstractEventLoop, ev: asyncio.Event) -> None:
        with self.cv:
            self._listeners.append((loop, ev))

    def remove_listener(self, ev: asyncio.Event) -> None:
        with self.cv:
            self._listeners = [le for le in self._listeners if le[1] is not ev]

    # ---- on the loop -----------------------------------------------------------------------

    def _start(self) -> None:
        self._wake = asyncio.Event()
        task = self.loop.create_task(self._main())
        task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # the loop shut down under the program
            self.error = self.error or RuntimeError("the program's event loop stopped")
            self._finish()

    def _push(self, expr: Any) -> None:
        self._queue.append(expr)
        assert self._wake is not None
        self._wake.set()

    async def _main(self) -> None:
        assert self._wake is not None
        try:
            while True:
                while not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                expr = self._queue.popleft()
                if expr is _END:
                    return
                if self.error is None:
                    try:
                        await self._execute(expr)
                    except Exception as e:  # the program's failure; the state keeps it
                        self.error = e
                with self.cv:
                    self.completed += 1
                self._changed()
        finally:
            self._finish()

    def _finish(self) -> None:
        with self.cv:
            self.ended = True
            if not self.done.done():
                self.done.set_result(None)
            self.cv.notify_all()
        self._changed()

    def _changed(self) -> None:
        """Wake every reader (from any thread): blocking ones and async iterators."""
        with self.cv:
            self.version += 1
            self.cv.notify_all()
            listeners = list(self._listeners)
        for loop, ev in listeners:
            if _on_loop_thread(loop):
                ev.set()
            else:
                loop.call_soon_threadsafe(ev.set)

    def wait_for_name(self, name: str, table: dict[str, Any]) -> None:
        """Outside the program's body, a name not set yet may still come: wait for it."""
        if IN_BODY.active:
            return
        with self.cv:
            while not (name in table or self.done.done()):
                self.cv.wait(0.5)
                check_running(self.loop)

    def _fill(self, value: str) -> None:
        self.text += value
        self._changed()

    async def _execute(self, e: Expr) -> None:
        if isinstance(e, Text):
            self._fill(e.value)
        elif isinstance(e, ExprList):
            for x in e.items:
                await self._execute(x)
        elif isinstance(e, Gen):
            await self._gen(e)
        elif isinstance(e, Select):
            await self._select(e)
        elif isinstance(e, RoleBegin):
            if self.cur_role is not None:
                raise ValueError(f"role {e.role!r} begins inside role {self.cur_role!r}: roles do not nest")
            first = not self.messages and self.cur_role is None and not self.text
            self._fill(self.template.prefix(e.role, first))
            self.cur_role, self.role_begin = e.role, len(self.text)
        elif isinstance(e, RoleEnd):
            if self.cur_role != e.role:
                raise ValueError(f"role {e.role!r} ends but the open role is {self.cur_role!r}")
            content = self.text[self.role_begin :]
            self._fill(self.template.suffix(e.role))
            self.messages.append({"role": e.role, "content": content})
            self.cur_role = None
        elif isinstance(e, VarScopeBegin):
            self.scopes[e.name] = len(self.text)
        elif isinstance(e, VarScopeEnd):
            self._set_var(e.name, self.text[self.scopes.pop(e.name) :], None)
        elif isinstance(e, CachePrefix):
            if self.text:
                await self.backend.cache_prefix(self.text)
        elif isinstance(e, Concat):
            for st in e.states:
                ex = st._exec
                await asyncio.wrap_future(ex.done)
                self._fill(ex.text[ex.fork_start :])
        else:
            raise TypeError(f"unknown expression {e!r}")

    def _set_var(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        with self.cv:
            self.variables[name] = value
            if meta is not None:
                self.meta[name] = meta
            self.vars_done.add(name)
        self._changed()

    def resolve(self, g: Gen) -> GenParams:
        over = dict(g.overrides)
        if "stop" in over:
            over["stop"] = _as_tuple(over["stop"])
        if "stop_token_ids" in over:
            over["stop_token_ids"] = tuple(over["stop_token_ids"])
        if isinstance(over.get("json_schema"), dict):
            over["json_schema"] = json.dumps(over["json_schema"])
        if g.dtype is not None:
            if g.dtype not in _DTYPES:
                raise ValueError(f"gen(dtype={g.dtype!r}): use int, float, str or bool")
            over["dtype"] = _DTYPES[g.dtype]
        params = dataclasses.replace(self.defaults, **over)
        if sum(x is not None for x in (params.regex, params.json_schema, params.ebnf, params.dtype)) > 1:
            raise ValueError("gen: give at most one of regex, json_schema, ebnf and dtype")
        return params

    async def _gen(self, g: Gen) -> None:
        params = self.resolve(g)
        if self.stream and params.n == 1:
            out = ""
            meta: dict[str, Any] = {}
            if g.name is not None:
                self._set_stream_var(g.name, "", meta)
            async for chunk in self.backend.stream(self.text, params):
                out += chunk.text
                meta = chunk.meta_info
                self.text += chunk.text
                if g.name is not None:
                    self._set_stream_var(g.name, out, meta)
                self._changed()
            self._set_var(g.name, out, meta)
            return
        results = await self.backend.generate(self.text, params)
        self._fill(results[0].text)
        if params.n == 1:
            self._set_var(g.name, results[0].text, results[0].meta_info)
        else:
            meta = dict(results[0].meta_info, choices=[r.meta_info for r in results])
            self._set_var(g.name, [r.text for r in results], meta)

    def _set_stream_var(self, name: str, value: str, meta: dict[str, Any]) -> None:
        with self.cv:
            self.variables[name] = value
            self.stream_meta[name] = meta

    async def _select(self, e: Select) -> None:
        if not e.choices or not all(isinstance(c, str) and c for c in e.choices):
            raise ValueError("select: choices must be a non-empty list of non-empty strings")
        if e.temperature > 1e-5:
            raise ValueError("select: only temperature 0 (the most likely choice) is supported")
        unconditional = bool(e.method.requires_unconditional_logprobs)
        scored = await self.backend.score_choices(self.text, list(e.choices), unconditional)
        uncond = None
        if unconditional:
            uncond = [c.unconditional for c in scored if c.unconditional is not None]
            if len(uncond) != len(scored):
                raise RuntimeError("select: the backend gave no unconditional logprobs")
        decision = decide(e.method, e.choices, [c.token_logprobs for c in scored], uncond)
        if decision.decision not in e.choices:
            raise ValueError(f"select: the choices method picked {decision.decision!r}, not a choice")
        self._fill(decision.decision)
        meta = dict(decision.meta_info or {}, usage=[c.meta_info for c in scored])
        self._set_var(e.name, decision.decision, meta)


def _as_tuple(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def check_running(loop: asyncio.AbstractEventLoop) -> None:
    if loop.is_closed() or not loop.is_running():
        raise RuntimeError("the event loop running the program stopped (was the engine closed?)")


def wait_future(fut: concurrent.futures.Future[Any], loop: asyncio.AbstractEventLoop) -> Any:
    """`fut.result()` that gives up when `loop`, which should settle it, has stopped."""
    while True:
        try:
            return fut.result(timeout=0.5)
        except concurrent.futures.TimeoutError:
            check_running(loop)


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
