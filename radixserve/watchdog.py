"""`Watchdog`: tells the callers when the worker thread stops making progress.

A step whose work never ends (a library call that loops, a device that hangs)
cannot be interrupted from another thread. What can be done is to stop anyone
from waiting on it: a task in the engine's event loop reads the worker's
heartbeat (`Worker.stalled_for()`) every `period` seconds; once one loop
iteration has run for `timeout_s` while there is work, the engine is stalled:
`healthy` is False (so `/health` answers 503), every pending request fails
with `EngineStalledError` naming the requests of the stuck step, and new
requests are refused at once. When the worker finishes that iteration after
all, the engine is healthy again and serves new requests; the failed ones are
aborted on the worker, so their KV slots come back.

The timeout (`EngineConfig.watchdog_timeout_s`) must exceed the longest
honest step: a first step that compiles kernels on a fresh GPU, or a large
prefill chunk on a slow CPU, takes seconds; the default of 120 s leaves room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from radixserve.errors import EngineStalledError
from radixserve.sched.worker import Worker

log = logging.getLogger(__name__)

OnStall = Callable[[EngineStalledError], None]


class Watchdog:
    def __init__(self, worker: Worker, timeout_s: float, on_stall: OnStall) -> None:
        self.worker = worker
        self.timeout_s = timeout_s
        self.period = min(1.0, timeout_s / 4)
        self.on_stall = on_stall
        self.stalls = 0  # times the worker was found stalled (stats)
        self.error: EngineStalledError | None = None  # set while the worker is stalled
        self._task: asyncio.Task[None] | None = None

    @property
    def stalled(self) -> bool:
        return self.error is not None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="radixserve-watchdog")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def check(self) -> None:
        """One look at the heartbeat (the task calls this every `period` seconds)."""
        idle = self.worker.stalled_for()
        if idle < self.timeout_s:
            if self.error is not None:
                log.warning("radixserve worker made progress again after a stall")
            self.error = None
            return
        if self.error is not None:
            return  # this stall was reported already
        rids = self.worker.in_step()
        shown = ", ".join(rids[:8]) + (f" and {len(rids) - 8} more" if len(rids) > 8 else "")
        self.error = EngineStalledError(
            f"the engine's worker made no progress for {idle:.0f} s "
            f"(watchdog_timeout_s={self.timeout_s:g}) in a step serving request(s) {shown or '(none)'}; "
            "pending requests were failed and new ones are refused until it recovers"
        )
        self.stalls += 1
        log.error("radixserve: %s", self.error)
        self.on_stall(self.error)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.check()
