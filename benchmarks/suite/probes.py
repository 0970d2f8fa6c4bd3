"""A probe on the worker thread: host time per step and what each step's attention reads.

The engine has no public per-step hook, so the probe wraps three methods of
one engine's worker *instance* (nothing in radixserve changes):

- `scheduler.schedule()`: the time to pick and build the next batch;
- `worker._launch(batch)`: `runner.launch(batch.step)` (enqueueing the
  step); the step's host-side lengths give the K/V tokens the attention
  kernels read this step (`len(step.kv_indices)`, i.e. the sum of
  `prefix_lens + extend_lens`, less what the step's cascade groups read
  once instead of once per row), read without touching the device;
- `worker._finish_step(batch, handle)`: the probe first waits on the step's
  CUDA event itself, timed apart ("wait": the host idles on the device), then
  runs the original (output processing, on the host).

Host time per step = schedule + launch + finish - wait (on the CPU the
forward runs inside `launch`, so there it includes the model). The wrappers
cost a few microseconds per step. Where the worker changes shape, the probe
falls back to `ModelRunner.launch(step input)` (any object holding host
`extend_lens` / `prefix_lens`, itself or in a `batch`/`forward` field) and to
`Scheduler.process` (then the wait is not seen); a hook it cannot find is
listed in `missing` and its figures are left out.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixserve import AsyncEngine


@dataclass
class Step:
    index: int  # launch order in this engine
    t_launch: float  # perf_counter when the launch started
    batch_size: int
    num_tokens: int  # new tokens in the step
    kv_tokens: int | None  # K/V entries the attention reads (the kv_indices length)
    decode: bool  # every request brings one token
    kv_lens: list[int] | None  # per request, for page-waste arithmetic
    schedule_s: float = 0.0
    launch_s: float = 0.0
    finish_s: float = 0.0  # processing of this step's outputs, wait excluded
    wait_s: float = 0.0


@dataclass
class StepProbe:
    steps: list[Step] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # hooks not found (their figures are left out)
    _pending_schedule: float = 0.0
    _count: int = 0
    _inflight: deque[Step] = field(default_factory=deque)  # launched, outputs not processed yet

    @classmethod
    def attach(cls, engine: AsyncEngine) -> StepProbe:
        probe = cls()
        worker: Any = engine._worker  # private on purpose: there is no public per-step hook
        sched: Any = getattr(worker, "scheduler", None)
        if callable(getattr(sched, "schedule", None)):
            sched.schedule = probe._wrap_schedule(sched.schedule)
        else:
            probe.missing.append("Scheduler.schedule")
        # The launch: Worker._launch(batch), else ModelRunner.launch(step input).
        runner: Any = getattr(worker, "runner", None)
        if callable(getattr(worker, "_launch", None)):
            worker._launch = probe._wrap_launch(worker._launch)
        elif callable(getattr(runner, "launch", None)):
            runner.launch = probe._wrap_launch(runner.launch)
        else:
            probe.missing.append("Worker._launch / ModelRunner.launch")
        # The outputs: Worker._finish_step(batch, handle) (wait timed apart), else
        # Scheduler.process (its caller waits first, so the wait is not seen).
        if callable(getattr(worker, "_finish_step", None)):
            worker._finish_step = probe._wrap_finish(worker._finish_step, wait=True)
        elif callable(getattr(sched, "process", None)):
            sched.process = probe._wrap_finish(sched.process, wait=False)
            probe.missing.append("Worker._finish_step (wait not measured)")
        else:
            probe.missing.append("Worker._finish_step / Scheduler.process")
        return probe

    def _wrap_schedule(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def schedule(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = orig(*a, **kw)
            if _lengths(out) is not None:  # a batch (not None or the need-sync marker)
                self._pending_schedule = time.perf_counter() - t0
            return out

        return schedule

    def _wrap_launch(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def launch(batch: Any, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = orig(batch, *a, **kw)
            took = time.perf_counter() - t0  # the probe's own bookkeeping below stays outside
            step = _describe(batch, t0, self._count)
            self._count += 1
            step.launch_s = took
            step.schedule_s, self._pending_schedule = self._pending_schedule, 0.0
            self.steps.append(step)
            self._inflight.append(step)
            return out

        return launch

    def _wrap_finish(self, orig: Callable[..., Any], wait: bool) -> Callable[..., Any]:
        def finish(batch: Any, handle: Any, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            event = getattr(handle, "event", None) if wait else None
            if event is not None:
                event.synchronize()
            t1 = time.perf_counter()
            out = orig(batch, handle, *a, **kw)
            if self._inflight:  # steps finish in launch order
                step = self._inflight.popleft()
                step.wait_s, step.finish_s = t1 - t0, time.perf_counter() - t1
            return out

        return finish

    def clear(self) -> None:
        self.steps.clear()

    def decode_steps(self, batch_size: int | None = None) -> list[Step]:
        """Decode-only steps (of exactly `batch_size` requests if given), whose outputs were processed."""
        pending = {id(s) for s in list(self._inflight)}
        return [
            s
            for s in list(self.steps)
            if s.decode and (batch_size is None or s.batch_size == batch_size) and id(s) not in pending
        ]

    def widest_decode_steps(self) -> list[Step]:
        """The processed decode steps of the largest batch size seen (empty if none)."""
        done = self.decode_steps()
        widest = max((s.batch_size for s in done), default=0)
        return [s for s in done if s.batch_size == widest]


def _lengths(obj: Any) -> tuple[list[int], list[int]] | None:
    """(extend_lens, prefix_lens) on the host, from a batch or a step input holding one."""
    for cand in (obj, *(getattr(obj, n, None) for n in ("batch", "forward", "fb", "step", "inputs"))):
        ext, pre = getattr(cand, "extend_lens", None), getattr(cand, "prefix_lens", None)
        if ext is not None and pre is not None:
            return [int(e) for e in ext], [int(p) for p in pre]
    return None


def _describe(batch: Any, t0: float, index: int) -> Step:
    lens = _lengths(batch)
    ext, pre = lens if lens is not None else ([], [])
    kv_lens = [p + e for p, e in zip(pre, ext)] if len(pre) == len(ext) and ext else None
    step = getattr(batch, "step", batch)  # the StepInput, or an older tree's batch holding its fields
    kv_idx = getattr(step, "kv_indices", None)
    kv = len(kv_idx) if kv_idx is not None else (sum(kv_lens) if kv_lens else None)
    groups = getattr(step, "cascade", None)  # shared-prefix groups: their prefixes are read once
    if kv is not None and groups is not None:
        kv -= groups.saved_tokens
    return Step(index, t0, len(ext), sum(ext), kv, bool(ext) and all(e == 1 for e in ext), kv_lens)


def median_ms(xs: list[float]) -> float:
    return 1000 * statistics.median(xs) if xs else float("nan")


def host_profile(steps: list[Step]) -> dict[str, float]:
    """Median milliseconds per step: each host part, their sum, the wait, and the launch-to-launch period."""
    if not steps:
        return {}
    host = [s.schedule_s + s.launch_s + s.finish_s for s in steps]
    periods = [b.t_launch - a.t_launch for a, b in zip(steps, steps[1:]) if b.index == a.index + 1]
    return {
        "host_ms": median_ms(host),
        "host_mean_ms": 1000 * statistics.fmean(host),
        "schedule_ms": median_ms([s.schedule_s for s in steps]),
        "launch_ms": median_ms([s.launch_s for s in steps]),
        "process_ms": median_ms([s.finish_s for s in steps]),
        "wait_ms": median_ms([s.wait_s for s in steps]),
        "step_period_ms": median_ms(periods) if periods else float("nan"),
        "steps": float(len(steps)),
    }
