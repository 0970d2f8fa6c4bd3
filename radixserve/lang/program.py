"""One run of a program: its executors (the root and every fork), the body, the end.

The body runs in a thread of its own (the caller's for `run`, a pool thread
for `arun`), so that reading a variable mid-program may block while the
program's tasks keep running on the backend's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from radixserve.lang.backend import Backend, GenParams
from radixserve.lang.chat_template import ChatTemplate
from radixserve.lang.executor import IN_BODY, Executor, ProgramError
from radixserve.lang.state import ProgramState


class Program:
    def __init__(
        self,
        backend: Backend,
        loop: asyncio.AbstractEventLoop,
        defaults: GenParams,
        template: ChatTemplate,
        stream: bool,
    ) -> None:
        self.executors: list[Executor] = []
        self._lock = threading.Lock()
        root = Executor(backend, loop, defaults, template, stream, self._register)
        self.state = ProgramState(root)
        self.body_error: BaseException | None = None
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()

    def _register(self, ex: Executor) -> None:
        with self._lock:
            self.executors.append(ex)

    def run_body(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        """Run the body (in the current thread), then end every state it made."""
        IN_BODY.active = True
        try:
            self.state.ret_value = func(self.state, **kwargs)
        except BaseException as e:  # the program's own code failed: stop its queued work too
            self.body_error = e
            with self._lock:
                for ex in self.executors:
                    if ex.error is None:
                        ex.error = e
        finally:
            IN_BODY.active = False
            with self._lock:
                executors = list(self.executors)
            for ex in executors:
                ex.end()
            self._chain(executors)

    def _chain(self, executors: list[Executor]) -> None:
        pending = [ex.done for ex in executors]

        def check(_: Any) -> None:
            if all(f.done() for f in pending) and not self.finished.done():
                self.finished.set_result(None)

        for f in pending:
            f.add_done_callback(check)

    def error(self) -> BaseException | None:
        if self.body_error is not None:
            return self.body_error
        with self._lock:
            for ex in self.executors:
                if ex.error is not None:
                    return ex.error
        return None

    def result(self) -> ProgramState:
        """The state, or ProgramError (with the state) when the program failed."""
        err = self.error()
        root = self.state._exec
        if err is not None:
            root.error = root.error or err
            raise ProgramError(f"the program failed: {err!r}", self.state) from err
        return self.state
