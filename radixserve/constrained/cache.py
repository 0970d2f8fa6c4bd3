"""`GrammarCache`: compile grammars off the worker thread, and remember them.

`get()` runs in the caller's event loop: the compile runs in a thread
(xgrammar releases the GIL), so the request waits outside the batch until its
grammar is ready and the worker never blocks on a compile. Entries are keyed
by (kind, canonical text) in a bounded LRU that keeps failures too, so a bad
schema sent again fails at once. Concurrent requests for one key share one
compile. A compile slower than the timeout fails that request only; it goes
on in its thread and its result still lands in the cache for later requests.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from radixserve.constrained.base import GrammarBackend
from radixserve.constrained.spec import GrammarSpec


class GrammarCache:
    def __init__(self, backend: GrammarBackend, capacity: int = 512, timeout_s: float = 60.0) -> None:
        self.backend = backend
        self.capacity = capacity
        self.timeout_s = timeout_s
        self._entries: OrderedDict[GrammarSpec, asyncio.Future[tuple[Any, str | None]]] = OrderedDict()
        self.compile_times: list[float] = []  # seconds per compile done (for benchmarks)
        self.hits = 0

    def _compile(self, spec: GrammarSpec) -> tuple[Any, str | None]:
        t0 = time.perf_counter()
        try:
            return self.backend.compile(spec), None
        except ValueError as e:
            return None, str(e)
        except Exception as e:  # noqa: BLE001 - any library failure is this request's error
            return None, f"{spec.kind}: {type(e).__name__}: {e}"
        finally:
            self.compile_times.append(time.perf_counter() - t0)

    async def get(self, spec: GrammarSpec, timeout_s: float | None = None) -> Any:
        """The compiled grammar; ValueError naming the problem if it does not compile in time."""
        fut = self._entries.get(spec)
        if fut is not None:
            self.hits += 1
            self._entries.move_to_end(spec)
        else:
            fut = asyncio.ensure_future(asyncio.to_thread(self._compile, spec))
            self._entries[spec] = fut
            self._trim()
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            compiled, err = await asyncio.wait_for(asyncio.shield(fut), limit)
        except asyncio.TimeoutError:
            raise ValueError(f"{spec.kind}: the grammar did not compile within {limit:g} s") from None
        if err is not None:
            raise ValueError(err)
        return compiled

    def _trim(self) -> None:
        # Drop the least recently used finished entries; running compiles stay.
        for key in list(self._entries):
            if len(self._entries) <= self.capacity:
                break
            if self._entries[key].done():
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
