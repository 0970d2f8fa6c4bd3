"""`WorkerLink`: the caller's event loop and the worker thread, joined.

It owns what both sides touch: the event loop the engine belongs to, the worker, the sinks
its outputs are routed to (sinks.py), the watchdog, and the worker's failure. The worker
posts through it (`post`, `fail`: worker thread); the engine submits through it (`submit`,
`abort`, `ask`: event loop). Every way a worker can end (a failure, a closed loop, a stall,
shutdown) ends every pending caller here, so nobody waits forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from radixserve.errors import WRONG_LOOP, EngineClosedError, EngineDeadError, EngineStalledError
from radixserve.outputs import RequestOutput
from radixserve.sched.messages import AbortRequest, AddRequests, CheckIntegrity, FlushCache, ReadStats, Reply
from radixserve.sched.request import Request
from radixserve.sched.worker import Worker
from radixserve.sinks import Sink, Sinks
from radixserve.watchdog import Watchdog

Query = Callable[[Reply], FlushCache | ReadStats | CheckIntegrity]


class WorkerLink:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.worker: Worker | None = None
        self.sinks = Sinks()
        self.error: BaseException | None = None
        self.watchdog: Watchdog | None = None

    # ---- lifecycle (event loop) ------------------------------------------------------------

    def reset(self) -> None:
        """Before a (re)start: nothing pending, no failure."""
        self.sinks.idle = asyncio.Event()
        self.sinks.idle.set()
        self.error = None

    def run(self, worker: Worker, watchdog_timeout_s: float | None) -> None:
        """Start `worker` (built with this link's `post` and `fail`) and its watchdog."""
        self.worker = worker
        worker.start()
        if watchdog_timeout_s is not None:
            self.watchdog = Watchdog(worker, watchdog_timeout_s, self.on_stall)
            self.watchdog.start()

    async def stop(self, drain: bool) -> None:
        """Stop the worker; with `drain`, first let every submitted request finish. A request
        still pending then ends with `EngineClosedError`."""
        if self.worker is None:
            return
        if asyncio.get_running_loop() is not self.loop:
            assert self.loop is not None
            if not self.loop.is_closed():
                raise RuntimeError(WRONG_LOOP)
            drain = False  # its loop is gone, and with it everyone who could wait for a result
        elif drain and self.error is None:
            assert self.sinks.idle is not None
            await self.sinks.idle.wait()
        worker, self.worker = self.worker, None
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            await watchdog.stop()
        # A worker stuck in a step that never ends is left behind (a daemon thread) rather
        # than waited for: the watchdog's timeout bounds how long an honest step takes.
        await asyncio.to_thread(worker.stop, None if watchdog is None else watchdog.timeout_s)
        if self.loop is not None and not self.loop.is_closed():
            self.sinks.close(EngineClosedError("the engine was shut down before this request finished"))

    @property
    def healthy(self) -> bool:
        loop_ok = self.loop is not None and not self.loop.is_closed()
        stalled = self.watchdog is not None and self.watchdog.stalled
        running = self.worker is not None and self.worker.alive and self.error is None
        return running and loop_ok and not stalled

    @property
    def stalls(self) -> int:
        return self.watchdog.stalls if self.watchdog is not None else 0

    def check_loop(self) -> None:
        if self.loop is not None and asyncio.get_running_loop() is not self.loop:
            raise RuntimeError(WRONG_LOOP)

    def check_alive(self) -> None:
        self.check_loop()
        if self.error is not None:
            raise EngineDeadError(f"the engine's worker failed: {self.error!r}") from self.error
        if self.worker is None:
            raise RuntimeError(
                "the engine is not running: use `async with engine:` or `await engine.start()`"
            )
        if self.watchdog is not None and self.watchdog.error is not None:
            raise self.watchdog.error

    # ---- requests and queries (event loop) ---------------------------------------------------

    def submit(self, reqs: list[Request], sink: Sink, request_id: str | None) -> str:
        rid = reqs[0].rid  # the submission's key
        self.sinks.add(rid, sink, request_id, len(reqs))
        assert self.worker is not None
        self.worker.submit(AddRequests(reqs))
        return rid

    def abort_quietly(self, rid: str) -> None:
        if self.worker is not None and self.error is None:
            self.worker.submit(AbortRequest(rid, "cancelled by the caller"))

    def abort(self, request_id: str) -> None:
        self.check_loop()
        if self.worker is not None:
            self.worker.submit(AbortRequest(self.sinks.key_of(request_id), "aborted by abort()"))

    async def ask(self, query: Query) -> object:
        """Send a query message to the worker and wait for its answer."""
        self.check_alive()
        assert self.loop is not None and self.worker is not None
        fut, reply = self.sinks.new_call(self.loop, self.to_loop)
        try:
            self.worker.submit(query(reply))
            return await fut
        finally:
            self.sinks.calls.discard(fut)

    def on_stall(self, err: EngineStalledError) -> None:  # event loop (the watchdog)
        keys = self.sinks.close(err)
        worker = self.worker
        if worker is not None:  # their KV comes back if the worker's step ends after all
            for key in keys:
                worker.submit(AbortRequest(key, "failed by the watchdog: the engine stalled"))

    # ---- from the worker thread --------------------------------------------------------------

    def to_loop(self, fn: Callable[..., object], *args: object) -> None:
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell, so stop serving
            if self.error is None:
                self.error = EngineDeadError(
                    "the event loop this engine was started in is closed; start a new engine in your loop"
                )
            worker = self.worker
            if worker is not None:
                worker.stop()

    def post(self, outputs: list[RequestOutput]) -> None:
        self.sinks.post(outputs, self.to_loop)

    def fail(self, err: BaseException) -> None:
        def fail_all() -> None:
            self.error = err
            self.sinks.close(EngineDeadError(f"the engine's worker failed: {err!r}"))

        self.to_loop(fail_all)
