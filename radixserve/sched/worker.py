"""The worker thread: owns the scheduler and the runner, and keeps the device busy.

Overlap loop (step n on the device while the host finishes n-1 and builds n+1):

    batch_n = schedule()           # may use tokens of step n-1 still in flight
    handle_n = runner.launch(batch_n)
    process(batch_{n-1}, handle_{n-1}.wait())   # the one sync, for step n-1
    post outputs of n-1 to the event loop

Lockstep mode runs the same calls in order (launch, wait, process). The
caller's event loop talks to the worker only through `submit()` (a
thread-safe inbox) and the `post` callback (which the engine routes through
`loop.call_soon_threadsafe`, once per step). An exception here fails every
request still pending and marks the worker dead, so no caller hangs; an
error in one request's data (adding it, detokenizing its tokens) fails only
that request (`Scheduler.fail_request`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from radixserve.outputs import RequestOutput
from radixserve.runtime.runner import ModelRunner, StepHandle
from radixserve.sched.batch import Batch
from radixserve.sched.scheduler import NEED_SYNC, Scheduler

log = logging.getLogger(__name__)

Post = Callable[[list[RequestOutput]], None]
Fail = Callable[[BaseException], None]


class Worker:
    def __init__(
        self, scheduler: Scheduler, runner: ModelRunner, post: Post, fail: Fail, overlap: bool
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.post = post
        self.fail = fail
        self.overlap = overlap
        self.steps = 0
        self.error: BaseException | None = None
        self._inbox: deque[tuple[str, Any]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="radixserve-worker", daemon=True)

    # ---- called from other threads -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, kind: str, payload: Any = None) -> None:
        """kind: "add" (list of Request), "abort" ((rid, why)), "call" ((fn, callback))."""
        self._inbox.append((kind, payload))
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

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        last: tuple[Batch, StepHandle] | None = None
        if self.runner.stream is not None:
            # Every tensor this thread makes (batch inputs, sampler state) lives on
            # the runner's stream, so uses and frees are ordered with its kernels.
            torch.cuda.set_stream(self.runner.stream)
        try:
            while not self._stop:
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
                        self._wake.wait()
                        self._wake.clear()
                    continue
                assert isinstance(batch, Batch)
                handle = self._launch(batch)
                self.steps += 1
                if self.overlap:
                    if last is not None:
                        self._finish_step(*last)
                    last = (batch, handle)
                else:
                    self._finish_step(batch, handle)
            if last is not None:
                self._finish_step(*last)
        except BaseException as e:  # noqa: BLE001 - every error must reach the callers
            log.exception("radixserve worker failed")
            self.error = e
            self.fail(e)

    def _drain_inbox(self) -> None:
        while self._inbox:
            kind, payload = self._inbox.popleft()
            if kind == "add":
                for req in payload:
                    try:
                        self.scheduler.add(req)
                    except Exception as e:  # noqa: BLE001 - one request's data fails it alone
                        self.scheduler.fail_request(req, e)
            elif kind == "abort":
                rid, why = payload
                self.scheduler.abort(rid, why)
            elif kind == "call":
                fn, done = payload
                try:
                    done(fn(self.scheduler), None)
                except Exception as e:  # noqa: BLE001 - handed to the caller
                    done(None, e)
        self._flush_aborted()

    def _flush_aborted(self) -> None:
        aborted = self.scheduler.take_aborted()
        if aborted:
            self.post(aborted)

    def _launch(self, batch: Batch) -> StepHandle:
        pos, rows = batch.pending()
        top_k = max(
            (r.params.top_logprobs for r, lp in zip(batch.reqs, batch.prompt_lp_rows) if lp), default=0
        )
        fb = batch.to_forward(self.runner.device)
        return self.runner.launch(fb, batch.sampling, pos, rows, batch.prompt_lp_targets, top_k)

    def _finish_step(self, batch: Batch, handle: StepHandle) -> None:
        outputs = self.scheduler.process(batch, handle.result())
        if outputs:
            self.post(outputs)
