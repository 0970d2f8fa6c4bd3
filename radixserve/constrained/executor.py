"""`CompileExecutor`: grammar compiles on threads of their own, bounded, never waited for.

Compiles do not run in the event loop's default thread pool: a compile cannot be
stopped once it runs (xgrammar has no cancel), so slow ones would fill that
shared pool and then block every `asyncio.to_thread` caller, and the loop's
shutdown, which joins it. Here each compile gets a daemon thread of its own:

- at most `workers` compiles run at once; more wait in a queue (FIFO);
- when every request waiting for a running compile has given up (timed out or
  was cancelled), the compile is *abandoned*: it keeps its thread until it
  ends (its result is still delivered), but frees its place among the
  `workers`, so a slow compile never starves a quick one behind it;
- at most `max_abandoned` abandoned compiles may be running; past that, new
  compiles are refused with a `ValueError` until one of them ends, which
  bounds the threads and memory a stream of slow schemas can take;
- `close()` refuses new work and drops the queue; nobody joins a thread.

At interpreter exit, an `atexit` hook waits up to `EXIT_WAIT_S` for compiles
still running: in CPython before 3.14 a daemon thread that comes back from C++
into Python while the interpreter finalizes is ended with `pthread_exit`, which
aborts the process ("terminate called without an active exception") when it
unwinds through xgrammar's frames. A compile running longer than that at exit
can still end the process that way (it was exiting anyway).

Why threads, not processes: a compile in a child process could be killed on
timeout (a `CompiledGrammar` serializes to JSON and back), but each child
would need the tokenizer info (the whole vocabulary) sent or rebuilt, and a
process start costs about as much as a typical compile; the cap on abandoned
threads bounds the damage of compiles that cannot be stopped, which is
simpler and keeps quick compiles quick.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
EXIT_WAIT_S = 10.0  # the most the interpreter's exit waits for running compiles
_LIVE: weakref.WeakSet[CompileExecutor] = weakref.WeakSet()  # for the exit hook only


@dataclass(eq=False)
class CompileJob(Generic[T]):
    fn: Callable[[], T]
    future: Future[T] = field(default_factory=Future)
    abandoned: bool = False


class CompileExecutor:
    def __init__(self, workers: int = 2, max_abandoned: int = 2) -> None:
        if workers < 1 or max_abandoned < 0:
            raise ValueError("CompileExecutor: workers must be >= 1 and max_abandoned >= 0")
        self.workers = workers
        self.max_abandoned = max_abandoned
        self._lock = threading.Lock()
        self._queue: deque[CompileJob[object]] = deque()
        self._running = 0  # compiles on a thread that someone still waits for
        self._abandoned = 0  # compiles on a thread that nobody waits for
        self._closed = False
        self._threads: set[threading.Thread] = set()
        _LIVE.add(self)

    def submit(self, fn: Callable[[], T]) -> CompileJob[T]:
        """Queue `fn`; ValueError when too many abandoned compiles still run (or closed)."""
        job: CompileJob[T] = CompileJob(fn)
        with self._lock:
            if self._closed:
                raise ValueError("grammar compiles are closed: the engine is shutting down")
            if self._abandoned > 0 and self._abandoned >= self.max_abandoned:
                raise ValueError(
                    f"{self._abandoned} grammar compiles that ran past their timeout are still "
                    "running; new grammars are refused until one ends (cached ones still work)"
                )
            self._queue.append(job)  # type: ignore[arg-type]
            self._start_queued()
        return job

    def abandon(self, job: CompileJob[T]) -> None:
        """Nobody waits for `job` any more: drop it if queued, free its place if running."""
        with self._lock:
            if job.future.cancel():  # still queued: it never runs
                return
            if job.future.done() or job.abandoned:
                return
            job.abandoned = True
            self._running -= 1
            self._abandoned += 1
            self._start_queued()

    def close(self) -> None:
        """Refuse new compiles and cancel queued ones; running ones end on their own."""
        with self._lock:
            self._closed = True
            while self._queue:
                self._queue.popleft().future.cancel()

    @property
    def abandoned(self) -> int:
        return self._abandoned

    def _start_queued(self) -> None:  # under the lock
        while self._queue and self._running < self.workers and not self._closed:
            job = self._queue.popleft()
            if not job.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            self._running += 1
            thread = threading.Thread(target=self._run, args=(job,), name="grammar-compile", daemon=True)
            self._threads.add(thread)
            thread.start()

    def _run(self, job: CompileJob[object]) -> None:
        try:
            result = job.fn()
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits
            job.future.set_exception(e)
        else:
            job.future.set_result(result)
        finally:
            with self._lock:
                if job.abandoned:
                    self._abandoned -= 1
                else:
                    self._running -= 1
                self._threads.discard(threading.current_thread())
                self._start_queued()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait (blocking) until no compile runs; False if some still do after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                threads = list(self._threads)
            if not threads:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            threads[0].join(left)


@atexit.register
def _wait_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for executor in list(_LIVE):
        executor.wait_idle(max(0.0, deadline - time.monotonic()))
