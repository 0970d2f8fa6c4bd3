"""Where the worker's outputs go: one sink per submission, on the event loop.

The worker posts each step's outputs once (`Sinks.post`: a mailbox, and one
`loop.call_soon_threadsafe` unless a delivery is already due, so a busy loop
takes several steps in one go); `Sinks.dispatch` routes them by key to the sink of the caller who submitted
them: a `Stream` that `generate()` drains, or a `Collector` that resolves
`complete()` once. It also counts the completions still to finish,
so `shutdown(drain=True)` knows when the engine is idle.

Each submission has its own key: the request id, or the id plus a suffix
while an earlier request of the same id is still winding down, so late
outputs of a cancelled request never reach a new request that reuses its id.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from radixserve.outputs import RequestOutput, merge

if TYPE_CHECKING:
    from radixserve.sched.request import Request


class Sink(Protocol):
    def put_nowait(self, item: RequestOutput | BaseException) -> None: ...


class Stream:
    """The sink of `generate()`: the outputs not yet read, at most one per completion.

    Taking an output tells the worker its consumer has read it: the worker
    builds no new output for a completion whose previous one is still unread
    (`unread[row]`, one flag per request row, sched/sampling_rows.py; the next
    output carries every token since). An output that still arrives while its
    completion's previous one is unread (a final output, or a row that changed
    hands) is merged into it (`outputs.merge`). So a consumer that keeps up
    reads every token as soon as its step is processed, and one that falls
    behind reads fewer, larger outputs and wakes at most once per step. Every
    token and every piece of text still arrives exactly once, in order; an
    error is raised after the outputs before it.
    """

    __slots__ = ("_ready", "_waiter", "_error", "_loop", "_reqs", "_unread")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, reqs: Sequence[Request] = (), unread: np.ndarray | None = None
    ) -> None:
        self._ready: dict[int, RequestOutput] = {}  # by completion index, oldest first
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._loop = loop
        # The completions by index; their `row` is read (never written) here, see `take`.
        self._reqs = reqs
        self._unread = unread

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            if self._error is None:
                self._error = item
        else:
            prev = self._ready.get(item.index)
            self._ready[item.index] = item if prev is None else merge(prev, item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # not cancelled with its reader
                waiter.set_result(None)

    def take(self) -> RequestOutput | None:
        """The oldest unread output, or None if there is none yet; the error once all are read."""
        ready = self._ready
        if ready:
            out = ready.pop(next(iter(ready)))
            if self._unread is not None and not out.finished:
                # The row as it is now: a stale read (a retracted request, re-admitted at
                # another row) only lets one extra output through, which merges as above.
                row = self._reqs[out.index].row
                if row >= 0:
                    self._unread[row] = False
            return out
        if self._error is not None:
            raise self._error
        return None

    def arm(self) -> asyncio.Future[None]:
        """A future the next `put_nowait` resolves (awaited by `generate` itself: no extra frame)."""
        self._waiter = waiter = self._loop.create_future()
        return waiter


class Collector:
    """The sink of `complete()`: keeps the final output of each completion, resolves once."""

    def __init__(self, n: int, done: asyncio.Future[list[RequestOutput]]) -> None:
        self.n = n
        self.done = done
        self.final: dict[int, RequestOutput] = {}

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        if self.done.done():
            return
        if isinstance(item, BaseException):
            self.done.set_exception(item)
        elif item.finished:
            self.final[item.index] = item
            if len(self.final) == self.n:
                self.done.set_result([self.final[i] for i in sorted(self.final)])


class Sinks:
    def __init__(self) -> None:
        self._streams: dict[str, Sink] = {}
        self._owner: dict[str, str] = {}  # caller's request id -> key of its live submission
        self._pending: dict[str, int] = {}  # key -> completions whose final output is still to come
        self._alias: dict[str, str] = {}  # key -> caller's request id, where the two differ
        self._keys = itertools.count()
        self._active = 0  # completions submitted and not yet finished
        self.idle: asyncio.Event | None = None  # set while nothing is pending (made in the engine's loop)
        self._mail: deque[list[RequestOutput]] = deque()  # steps posted by the worker, not yet dispatched
        self._mail_due = False  # a delivery is scheduled on the loop
        self.calls: set[asyncio.Future[Any]] = set()  # maintenance calls waiting on the worker

    def new_key(self, request_id: str) -> str:
        """The key of a new submission under `request_id`; ValueError if one is live."""
        if request_id in self._owner:
            raise ValueError(f"request_id {request_id!r} is already running")
        if request_id in self._pending:  # an earlier request of this id is still winding down
            return f"{request_id}\x00{next(self._keys)}"
        return request_id

    def key_of(self, request_id: str) -> str:
        """The key of the live submission under `request_id` (the id itself if none)."""
        return self._owner.get(request_id, request_id)

    def add(self, key: str, sink: Sink, request_id: str | None, n: int) -> None:
        user = request_id or key
        self._streams[key] = sink
        self._owner[user] = key
        self._pending[key] = n
        if user != key:
            self._alias[key] = user
        self._active += n
        assert self.idle is not None
        self.idle.clear()

    def release(self, key: str, request_id: str | None) -> None:
        """The caller stopped listening to submission `key`; its request id may be reused."""
        self._streams.pop(key, None)
        user = request_id or key
        if self._owner.get(user) == key:
            del self._owner[user]

    def post(self, outputs: list[RequestOutput], to_loop: Callable[[Any], None]) -> None:  # worker thread
        self._mail.append(outputs)
        # The loop clears the flag before it drains, so outputs appended after a drain
        # began always see it clear and schedule their own delivery.
        if not self._mail_due:
            self._mail_due = True
            to_loop(self._deliver)

    def _deliver(self) -> None:  # event loop
        self._mail_due = False
        mail = self._mail
        while mail:
            self.dispatch(mail.popleft())

    def dispatch(self, outputs: list[RequestOutput]) -> None:  # event loop
        for out in outputs:
            key = out.request_id
            user = self._alias.get(key) if self._alias else None
            if user is not None:
                out = replace(out, request_id=user)
            q = self._streams.get(key)
            if q is not None:
                q.put_nowait(out)
            if out.finished and key in self._pending:  # not one that `close` ended already
                self._active -= 1
                left = self._pending.get(key, 0) - 1
                if left > 0:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
                    self._alias.pop(key, None)
        if self._active <= 0 and self.idle is not None:
            self._active = 0
            self.idle.set()

    def new_call(
        self, loop: asyncio.AbstractEventLoop, to_loop: Callable[..., None]
    ) -> tuple[asyncio.Future[Any], Callable[[Any, BaseException | None], None]]:
        """A maintenance call's future, and the callback the worker settles it with."""
        fut: asyncio.Future[Any] = loop.create_future()

        def done(value: Any, err: BaseException | None) -> None:  # worker thread
            def settle() -> None:
                if not fut.done():
                    fut.set_exception(err) if err else fut.set_result(value)

            to_loop(settle)

        self.calls.add(fut)
        return fut, done

    def close(self, err: BaseException) -> list[str]:  # event loop
        """Every pending submission and maintenance call ends with `err`; nobody waits forever.

        Returns the keys of the submissions that were pending."""
        keys = list(self._pending)
        for q in self._streams.values():
            q.put_nowait(err)
        for fut in self.calls:
            if not fut.done():
                fut.set_exception(err)
        self._streams.clear()
        self._owner.clear()
        self._pending.clear()
        self._alias.clear()
        self._active = 0
        if self.idle is not None:
            self.idle.set()
        return keys
