"""The worker thread: owns the scheduler and the runner, and keeps the device busy.

Overlap loop (step n on the device while the host finishes n-1 and builds n+1):

    batch_n = schedule()           # may use tokens of step n-1 still in flight
    handle_n = runner.launch(batch_n)
    process(batch_{n-1}, handle_{n-1}.result())   # the one sync, for step n-1
    post outputs of n-1 to the event loop

A batch with constrained rows (structured output) splits its step: the
forward of n is launched, step n-1 is processed (its tokens accepted by the
grammar matchers), then the bitmask rows of n are filled and only then is n
sampled, so the mask always follows the previous token in both modes.
Batches without constrained rows take the one-call path and pay nothing.

Lockstep mode runs the same calls in order (launch, wait, process). The
caller's event loop talks to the worker only through `submit()` (a thread-safe
inbox of typed messages, sched/messages.py) and the `post` callback (which the engine routes through
`loop.call_soon_threadsafe`, once per step). An exception here fails every
request still pending and marks the worker dead, so no caller hangs; an
error in one request's data (adding it, detokenizing its tokens) fails only
that request (`Scheduler.fail_request`).

Progress: `stalled_for()` tells how long the loop has been inside one
iteration while it has work (0 while it waits for work), and `in_step()` which
requests that iteration serves. The engine's watchdog (`radixserve/watchdog.py`)
reads both from the event loop: a step that never returns (a library call that
does not end) cannot be interrupted in a thread, but its callers can be told.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from radixserve.constrained.base import GrammarBackend
from radixserve.outputs import RequestOutput
from radixserve.runtime.runner import Forwarded, ModelRunner, StepHandle
from radixserve.sched.batch import Batch
from radixserve.sched.grammar import fill_bitmask
from radixserve.sched.messages import (
    AbortRequest,
    AddRequests,
    CheckIntegrity,
    FlushCache,
    ProfileWorker,
    ReadStats,
    Reply,
    WorkerMsg,
)
from radixserve.sched.scheduler import NEED_SYNC, Scheduler

log = logging.getLogger(__name__)

Post = Callable[[list[RequestOutput]], None]
Fail = Callable[[BaseException], None]


class Worker:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        post: Post,
        fail: Fail,
        overlap: bool,
        grammar: Callable[[], GrammarBackend] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.post = post
        self.fail = fail
        self.overlap = overlap
        self.grammar = grammar  # the engine's GrammarBackend, once one exists (constrained/base.py)
        self.mask_fill_s = 0.0  # host time spent filling bitmasks (benchmarks)
        self.mask_rows = 0
        self.steps = 0
        self.outputs = 0  # RequestOutputs posted to the event loop (fewer than tokens when streams lag)
        self.error: BaseException | None = None
        self._inbox: deque[WorkerMsg] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="radixserve-worker", daemon=True)
        # Heartbeat: when the current loop iteration began (monotonic), and whether the loop
        # is parked waiting for work (then nothing is stalled). Written by the worker only.
        self._beat = time.monotonic()
        self._parked = True
        self._step: Batch | None = None  # the batch launched or processed now

    # ---- called from other threads -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, msg: WorkerMsg) -> None:
        self._inbox.append(msg)
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        self._stop = True
        self._wake.set()
        # From the worker itself (its event loop closed under it) there is nothing to wait for.
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stalled_for(self) -> float:
        """Seconds the loop has spent in its current iteration with work to do (0 when parked)."""
        if self._parked or not self._thread.is_alive():
            return 0.0
        return time.monotonic() - self._beat

    def in_step(self) -> list[str]:
        """The request ids of the batch the loop launched or processes now (for error messages)."""
        batch = self._step
        return [r.rid for r in batch.reqs] if batch is not None else []

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        last: tuple[Batch, StepHandle] | None = None
        if self.runner.stream is not None:
            # Every tensor this thread makes (batch inputs, sampler state) lives on
            # the runner's stream, so uses and frees are ordered with its kernels.
            torch.cuda.set_stream(self.runner.stream)
        self._parked = False
        try:
            while not self._stop:
                self._beat = time.monotonic()
                self._drain_inbox()
                batch = self.scheduler.schedule(inflight=last is not None)
                if batch is NEED_SYNC or (batch is None and last is not None):
                    assert last is not None
                    self._finish_step(*last)
                    last = None
                    continue
                if batch is None:
                    self._flush_aborted()
                    if not self.scheduler.has_work and not self._inbox:
                        self._parked = True
                        self._wake.wait()
                        self._wake.clear()
                        self._parked = False
                    continue
                assert isinstance(batch, Batch)
                launched = self._launch(batch)
                self.steps += 1
                if self.overlap:
                    if last is not None:
                        self._finish_step(*last)
                    last = (batch, self._sample(batch, launched))
                else:
                    self._finish_step(batch, self._sample(batch, launched))
            if last is not None:
                self._finish_step(*last)
        except BaseException as e:  # noqa: BLE001 - every error must reach the callers
            log.exception("radixserve worker failed")
            self.error = e
            self.fail(e)

    def _drain_inbox(self) -> None:
        while self._inbox:
            self._handle(self._inbox.popleft())
        self._flush_aborted()

    def _handle(self, msg: WorkerMsg) -> None:
        sched = self.scheduler
        match msg:
            case AddRequests(reqs):
                for req in reqs:
                    try:
                        sched.add(req)
                    except Exception as e:  # noqa: BLE001 - one request's data fails it alone
                        sched.fail_request(req, e)
            case AbortRequest(rid, why):
                sched.abort(rid, why)
            case FlushCache(reply):
                self._answer(reply, sched.flush_cache)
            case ReadStats(reply):
                self._answer(reply, self._stats)
            case CheckIntegrity(reply):
                self._answer(reply, sched.check_integrity)
            case ProfileWorker(profiler, on):
                profiler.enable() if on else profiler.disable()

    @staticmethod
    def _answer(reply: Reply, query: Callable[[], object]) -> None:
        try:
            value = query()
        except Exception as e:  # noqa: BLE001 - handed to the caller
            reply(None, e)
        else:
            reply(value, None)

    def _stats(self) -> dict[str, int | float]:
        return {
            **self.scheduler.stats().as_dict(),
            "forward_steps": self.steps,
            # Outputs the worker built and posted: a streamed request gets none while its
            # previous one is unread by its consumer (backpressure, sched/process.py).
            "outputs": self.outputs,
            "mask_fill_s": self.mask_fill_s,
            "mask_rows": self.mask_rows,
        }

    def _flush_aborted(self) -> None:
        aborted = self.scheduler.take_aborted()
        if aborted:
            self.post(aborted)

    def _launch(self, batch: Batch) -> StepHandle | Forwarded:
        self._step = batch
        if self.grammar is not None and any(r.grammar is not None for r in batch.reqs):
            return self.runner.forward(batch.step)
        return self.runner.launch(batch.step)

    def _sample(self, batch: Batch, launched: StepHandle | Forwarded) -> StepHandle:
        """Finish a split step: fill its bitmask from the matchers as they are now, sample."""
        if isinstance(launched, StepHandle):
            return launched
        assert self.grammar is not None
        t0 = time.perf_counter()
        sampling_reqs = [r for r, s in zip(batch.reqs, batch.sample) if s]
        mask = fill_bitmask(sampling_reqs, self.grammar())
        self.mask_fill_s += time.perf_counter() - t0
        if mask is None:
            return self.runner.sample(launched)
        self.mask_rows += len(mask[1])
        return self.runner.sample(launched, *mask)

    def _finish_step(self, batch: Batch, handle: StepHandle) -> None:
        self._step = batch
        outputs = self.scheduler.process(batch, handle.result())
        if outputs:
            self.outputs += len(outputs)
            self.post(outputs)
