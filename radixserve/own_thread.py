"""`in_own_thread`: a blocking call awaited from the event loop, run in a one-thread executor that
ends with the call (where `asyncio.to_thread`'s pool threads stay alive); the engine's build
runs there (local_engine.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


async def in_own_thread(fn: Callable[[], None]) -> None:
    """`fn()` in a thread that ends with it, rather than `asyncio.to_thread`'s pool, whose
    threads stay. On the CPU, torch's OpenMP keeps a thread team for every live thread that ran
    a parallel op, and with more team threads than cores it wakes them through the kernel for
    each op: an idle pool thread that had built the engine slowed every step of the worker.
    `benchmarks/bench_deterministic.py` (2 cores, one run each way): default batch 83.0 against
    78.4 tok/s, alone 13.9 against 12.2; deterministic batch 57.0 against 34.5."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixserve-build")
    try:
        await asyncio.get_running_loop().run_in_executor(pool, fn)
    except BaseException:
        pool.shutdown(wait=False)  # a cancelled start must not hold the loop until the build ends
        raise
    pool.shutdown(wait=True)  # its thread is idle: it (and its OpenMP team) ends here
