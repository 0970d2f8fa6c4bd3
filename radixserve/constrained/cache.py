"""`GrammarCache`: compile grammars off the worker thread, and remember them.

`get()` runs in the caller's event loop: the compile runs on a thread of the
cache's own `CompileExecutor` (xgrammar releases the GIL), so the request
waits outside the batch until its grammar is ready and the worker never
blocks on a compile. Entries are keyed by (kind, canonical text) in an LRU
bounded by count (`capacity`) and by the compiled grammars' memory
(`max_bytes`, xgrammar's `memory_size_bytes`); failures are kept too, so a bad
schema sent again fails at once. Concurrent requests for one key share one
compile.

A compile slower than the timeout fails the requests waiting for it; once
none waits, it is abandoned (see executor.py: it runs on, bounded in number,
and new compiles are refused while too many do). While it runs, the same
grammar fails at once with the same timeout error; if it ends, its result
lands in the cache for later requests. `close()` (engine shutdown) refuses new
compiles and never waits for running ones.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from radixserve.constrained.base import GrammarBackend
from radixserve.constrained.executor import CompileExecutor, CompileJob
from radixserve.constrained.spec import GrammarSpec

Outcome = tuple[Any, str | None, int]  # (compiled or None, error or None, bytes)


@dataclass(eq=False)
class _Entry:
    job: CompileJob[Outcome]
    fut: asyncio.Future[Outcome]
    waiters: int = 0
    timed_out: float | None = None  # the limit a request waited for it in vain
    size: int = 0  # bytes, counted once it is done


class GrammarCache:
    def __init__(
        self,
        backend: GrammarBackend,
        capacity: int = 512,
        timeout_s: float = 60.0,
        max_bytes: int = 1 << 30,
        workers: int = 2,
        max_abandoned: int = 2,
    ) -> None:
        self.backend = backend
        self.capacity = capacity
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._executor = CompileExecutor(workers, max_abandoned)
        self._entries: OrderedDict[GrammarSpec, _Entry] = OrderedDict()
        self.bytes = 0  # memory of the compiled grammars kept
        self.compile_times: deque[float] = deque(maxlen=1024)  # seconds, recent compiles (benchmarks)
        self.hits = 0
        self.evictions = 0

    def _compile(self, spec: GrammarSpec) -> Outcome:  # on a compile thread
        t0 = time.perf_counter()
        try:
            compiled = self.backend.compile(spec)
            return compiled, None, self.backend.memory_bytes(compiled)
        except ValueError as e:
            return None, str(e), 0
        except Exception as e:  # noqa: BLE001 - any library failure is this request's error
            return None, f"{spec.kind}: {type(e).__name__}: {e}", 0
        finally:
            self.compile_times.append(time.perf_counter() - t0)

    async def get(self, spec: GrammarSpec, timeout_s: float | None = None) -> Any:
        """The compiled grammar; ValueError naming the problem if it does not compile in time."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        entry = self._entries.get(spec)
        if entry is not None and entry.fut.cancelled():  # dropped from the queue: compile anew
            self._forget(spec, entry)
            entry = None
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(spec)
            if entry.timed_out is not None and not entry.fut.done():
                raise ValueError(self._late(spec, entry.timed_out))
        else:
            try:
                job = self._executor.submit(lambda: self._compile(spec))
            except ValueError as e:
                raise ValueError(f"{spec.kind}: {e}") from None
            new = entry = _Entry(job, asyncio.wrap_future(job.future))
            self._entries[spec] = new
            new.fut.add_done_callback(lambda _: self._landed(spec, new))
            self._trim()
        entry.waiters += 1
        try:  # asyncio.wait: a cancel of this task never cancels the shared compile
            done, _ = await asyncio.wait({entry.fut}, timeout=limit)
        finally:
            entry.waiters -= 1
            if entry.waiters == 0 and not entry.fut.done():
                self._executor.abandon(entry.job)
        if not done:
            entry.timed_out = limit
            raise ValueError(self._late(spec, limit))
        if entry.fut.cancelled():
            raise ValueError(f"{spec.kind}: the compile was cancelled (the engine is shutting down)")
        compiled, err, _ = entry.fut.result()
        if err is not None:
            raise ValueError(err)
        return compiled

    def close(self) -> None:
        """Refuse new compiles, drop queued ones; running compiles are not waited for."""
        self._executor.close()

    @property
    def abandoned(self) -> int:
        """Compiles that ran past every waiter's timeout and still run."""
        return self._executor.abandoned

    @staticmethod
    def _late(spec: GrammarSpec, limit: float) -> str:
        return f"{spec.kind}: the grammar did not compile within {limit:g} s"

    def _landed(self, spec: GrammarSpec, entry: _Entry) -> None:
        if self._entries.get(spec) is not entry:
            return  # evicted or replaced meanwhile
        if entry.fut.cancelled():
            self._forget(spec, entry)
            return
        entry.size = entry.fut.result()[2]
        self.bytes += entry.size
        self._trim()

    def _forget(self, spec: GrammarSpec, entry: _Entry) -> None:
        if self._entries.get(spec) is entry:
            del self._entries[spec]
            self.bytes -= entry.size

    def _trim(self) -> None:
        # Drop the least recently used finished entries; running compiles stay. A grammar
        # larger than the whole budget still serves the requests that waited for it.
        for spec, entry in list(self._entries.items()):
            if len(self._entries) <= self.capacity and self.bytes <= self.max_bytes:
                break
            if entry.fut.done():
                self._forget(spec, entry)
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._entries)
