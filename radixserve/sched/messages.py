"""Messages into the worker thread: the event loop's only way to reach the scheduler.

`Worker.submit` queues one; the worker dispatches them by type between steps. A query
carries `reply`, which the worker calls with the answer or the error (it must not
block: the engine's reply hands the value to the event loop).
"""

from __future__ import annotations

import cProfile
from collections.abc import Callable
from dataclasses import dataclass

from radixserve.sched.request import Request

Reply = Callable[[object, BaseException | None], None]


@dataclass(frozen=True)
class AddRequests:
    reqs: list[Request]  # the n completions of one submission


@dataclass(frozen=True)
class AbortRequest:
    rid: str  # every completion of this request ends, finish_reason "abort"
    why: str  # the abort output's error


@dataclass(frozen=True)
class FlushCache:
    reply: Reply  # True: emptied; False: requests are running (nothing done)


@dataclass(frozen=True)
class ReadStats:
    reply: Reply  # dict[str, int | float]: the scheduler's counters and the worker's


@dataclass(frozen=True)
class CheckIntegrity:
    reply: Reply  # None, or the AssertionError of a broken invariant


@dataclass(frozen=True)
class ProfileWorker:
    """Turn a profiler on or off in the worker thread (cProfile sees one thread: the caller's)."""

    profiler: cProfile.Profile
    on: bool


WorkerMsg = AddRequests | AbortRequest | FlushCache | ReadStats | CheckIntegrity | ProfileWorker
