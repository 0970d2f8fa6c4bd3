"""`in_own_thread`: a blocking call awaited from the event loop, run in a thread of its own that
ends with the call (where `asyncio.to_thread`'s pool threads stay alive); the engine's build
runs there (local_engine.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


async def in_own_thread(fn: Callable[[], None]) -> None:
    """`fn()` in a thread that ends with it, rather than `asyncio.to_thread`'s pool, whose
    threads stay. On the CPU, torch's OpenMP keeps a thread team for every live thread that ran
    a parallel op, and with more team threads than cores it wakes them through the kernel for
    each op: an idle pool thread that had built the engine slowed every step of the worker.
    `benchmarks/bench_deterministic.py` (2 cores, one run each way): default batch 83.0 against
    78.4 tok/s, alone 13.9 against 12.2; deterministic batch 57.0 against 34.5."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():  # the start was cancelled meanwhile
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting caller
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed while it ran
            loop.call_soon_threadsafe(settle, error)

    thread = threading.Thread(target=run, name="radixserve-build", daemon=True)
    thread.start()
    await done
    thread.join()  # it has settled `done`: only its exit (and its OpenMP team's) remains
