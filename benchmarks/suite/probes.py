"""A probe on the worker thread: host time per step and what each step's attention reads.

The engine has no public per-step hook, so the probe wraps three methods of
one engine's worker *instance* (nothing in radixserve changes):

- `scheduler.schedule()`: the time to pick and build the next batch;
- `worker._launch(batch)`: `to_forward` plus `runner.launch` (enqueueing the
  step); the batch's host-side lengths give the K/V tokens the attention
  kernels read this step (`len(batch.kv_indices)`, i.e. the sum of
  `prefix_lens + extend_lens`), read without touching the device;
- `worker._finish_step(batch, handle)`: the probe first waits on the step's
  CUDA event itself, timed apart ("wait": the host idles on the device), then
  runs the original (output processing, on the host).

Host time per step = schedule + launch + finish - wait. (On the CPU the
forward runs inside `launch`, so there it includes the model itself.) The wrappers cost a
few microseconds per step. A hook missing from the worker (the step contract
is being reworked) is listed in `missing` and its figures are left out.
"""

from __future__ import annotations

import statistics
import time
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
    missing: list[str] = field(default_factory=list)
    _pending_schedule: float = 0.0
    _count: int = 0
    _by_batch: dict[int, Step] = field(default_factory=dict)

    @classmethod
    def attach(cls, engine: AsyncEngine) -> StepProbe:
        probe = cls()
        worker = engine._worker
        sched = getattr(worker, "scheduler", None)
        for obj, name in ((sched, "schedule"), (worker, "_launch"), (worker, "_finish_step")):
            if obj is None or not callable(getattr(obj, name, None)):
                probe.missing.append(name)
        if "schedule" not in probe.missing:
            orig_schedule = sched.schedule

            def schedule(*a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                out = orig_schedule(*a, **kw)
                if hasattr(out, "reqs"):  # a batch (not None or the need-sync marker)
                    probe._pending_schedule = time.perf_counter() - t0
                return out

            sched.schedule = schedule
        if "_launch" not in probe.missing:
            orig_launch = worker._launch

            def launch(batch: Any, *a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                out = orig_launch(batch, *a, **kw)
                took = time.perf_counter() - t0  # the probe's own bookkeeping below stays outside
                step = probe._describe(batch, t0, probe._count)
                probe._count += 1
                step.launch_s = took
                step.schedule_s, probe._pending_schedule = probe._pending_schedule, 0.0
                probe.steps.append(step)
                probe._by_batch[id(batch)] = step
                return out

            worker._launch = launch
        if "_finish_step" not in probe.missing:
            orig_finish = worker._finish_step

            def finish(batch: Any, handle: Any, *a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                event = getattr(handle, "event", None)
                if event is not None:
                    event.synchronize()
                t1 = time.perf_counter()
                out = orig_finish(batch, handle, *a, **kw)
                step = probe._by_batch.pop(id(batch), None)
                if step is not None:
                    step.wait_s, step.finish_s = t1 - t0, time.perf_counter() - t1
                return out

            worker._finish_step = finish
        return probe

    @staticmethod
    def _describe(batch: Any, t0: float, index: int) -> Step:
        ext = list(getattr(batch, "extend_lens", []) or [])
        pre = list(getattr(batch, "prefix_lens", []) or [])
        kv_lens = [p + e for p, e in zip(pre, ext)] if len(pre) == len(ext) and ext else None
        kv_idx = getattr(batch, "kv_indices", None)
        kv = len(kv_idx) if kv_idx is not None else (sum(kv_lens) if kv_lens else None)
        n = len(getattr(batch, "reqs", ext))
        return Step(index, t0, n, sum(ext), kv, bool(ext) and all(e == 1 for e in ext), kv_lens)

    def clear(self) -> None:
        self.steps.clear()

    def decode_steps(self, batch_size: int | None = None) -> list[Step]:
        """Decode-only steps (of exactly `batch_size` requests if given), whose outputs were processed."""
        pending = {id(s) for s in list(self._by_batch.values())}
        return [
            s
            for s in list(self.steps)
            if s.decode and (batch_size is None or s.batch_size == batch_size) and id(s) not in pending
        ]


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
