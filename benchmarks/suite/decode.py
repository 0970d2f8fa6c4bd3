"""W5 (shared-prefix decode) and the host time per decode step, from the worker probe.

W5 (BENCHMARKS.md, "Workloads"): a 4096-token random prefix is put in the cache
first (`max_tokens=0`), then N requests of the prefix plus 8 tokens of their
own decode 256 tokens each. K/V bytes read per decode step are what the
attention kernels read: the step's kv_indices length (every request's whole
context) times the pool's bytes per token (K and V, all layers). The engine
has no cascade (shared-prefix) attention today, so only "cascade=off" is
measured; `kv_bytes_prefix_once` is what a cascade kernel would read.

Bounds (GPU only) are the bytes a step must read at 4.3 TB/s (the H200's measured copy rate):
the weights plus the K/V read.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from benchmarks.suite.context import Ctx
from benchmarks.suite.engines import greedy, run_offline, running_engine
from benchmarks.suite.probes import StepProbe, host_profile
from benchmarks.suite.workloads import worker_profile
from radixserve import AsyncEngine, SamplingParams

HBM_BYTES_S = 4.3e12


def weight_bytes(engine: AsyncEngine) -> int:
    assert engine.loaded is not None
    return int(sum(p.numel() * p.element_size() for p in engine.loaded.model.parameters()))


def w5(ctx: Ctx, spec: str) -> None:
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    vocab = t.vocab(spec)
    rng = random.Random(5)
    prefix = [rng.randrange(vocab) for _ in range(s.w5_prefix)]
    with running_engine(t.config(spec)) as (engine, loop):
        probe = StepProbe.attach(engine)
        per_token = engine.pool.config.bytes_per_slot  # type: ignore[union-attr]
        weights = weight_bytes(engine)
        run_offline(engine, loop, [(prefix[:64], 4), (prefix[64:128], 4)])  # warm-up
        for n in s.w5_ns:
            loop.run_until_complete(engine.flush_cache())
            loop.run_until_complete(engine.complete(prefix, SamplingParams(max_tokens=0)))
            reqs = [prefix + [rng.randrange(vocab) for _ in range(s.w5_own)] for _ in range(n)]
            probe.clear()

            async def go(reqs: list[list[int]] = reqs) -> list:
                return list(await asyncio.gather(*(engine.complete(r, greedy(s.w5_out)) for r in reqs)))

            t0 = time.perf_counter()
            outs = loop.run_until_complete(go())
            wall = time.perf_counter() - t0
            cached = sum(o.usage.cached_tokens for o in outs) / (n * s.w5_prefix)
            steps = probe.decode_steps(n)
            prof = host_profile(steps)
            setting = f"N={n} cascade=off"
            extra = {
                "prefix": s.w5_prefix,
                "decode_steps": len(steps),
                "prefix_cached_frac": round(cached, 4),
            }
            ms_step = 1000 * wall / s.w5_out
            rec("W5", name, setting, "output_tok_s", n * s.w5_out / wall, **extra)
            kv = [x.kv_tokens for x in steps if x.kv_tokens is not None]
            kv_bytes = statistics.median(kv) * per_token if kv else None
            once = (s.w5_prefix + n * (s.w5_own + s.w5_out / 2)) * per_token  # at the middle step
            bound = bound_once = None
            if kv_bytes is not None and t.device == "cuda":
                bound = (weights + kv_bytes) / HBM_BYTES_S * 1000
                bound_once = (weights + once) / HBM_BYTES_S * 1000
            rec(
                "W5",
                name,
                setting,
                "ms_per_decode_step",
                ms_step,
                definition="wall / decode steps",
                bound=bound,
                bound_prefix_read_once=bound_once,
            )
            if prof:
                rec(
                    "W5",
                    name,
                    setting,
                    "decode_step_period_ms",
                    prof["step_period_ms"],
                    definition="median launch-to-launch of decode steps",
                    host_ms=round(prof["host_ms"], 4),
                )
            if kv_bytes is not None:
                rec(
                    "W5",
                    name,
                    setting,
                    "kv_bytes_per_decode_step",
                    kv_bytes,
                    kv_tokens=statistics.median(kv),
                    bytes_per_token=per_token,
                    kv_bytes_prefix_once=round(once),
                    source="len(kv_indices) per step",
                )
            else:
                print(f"[W5] no K/V figure: probe hooks missing {probe.missing}", flush=True)


def host_steps(ctx: Ctx, spec: str) -> None:
    """Host milliseconds per decode step at each batch size: the issue's table."""
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    vocab = t.vocab(spec)
    rng = random.Random(6)
    with running_engine(t.config(spec, max_running_requests=max(256, *s.host_bs))) as (engine, loop):
        probe = StepProbe.attach(engine)
        run_offline(engine, loop, [([1, 2, 3, 4], 4)] * 2)
        for bs in s.host_bs:
            reqs = [([rng.randrange(vocab) for _ in range(s.host_ctx)], s.host_steps) for _ in range(bs)]
            loop.run_until_complete(engine.flush_cache())
            probe.clear()
            with worker_profile(engine, ctx.profile and bs == max(s.host_bs)):  # where it goes, printed
                tps = run_offline(engine, loop, reqs)
            steps = probe.decode_steps(bs)
            prof = host_profile(steps)
            if not prof:
                print(f"[host] batch {bs}: no decode steps seen (probe hooks missing: {probe.missing})")
                continue
            setting = f"batch={bs} ctx={s.host_ctx}"
            rec(
                "host",
                name,
                setting,
                "host_ms_per_decode_step",
                prof["host_ms"],
                target=1.0,
                schedule_ms=round(prof["schedule_ms"], 4),
                launch_ms=round(prof["launch_ms"], 4),
                process_ms=round(prof["process_ms"], 4),
                steps=int(prof["steps"]),
                missing_hooks=probe.missing or None,
            )
            rec("host", name, setting, "wait_ms_per_decode_step", prof["wait_ms"])
            rec(
                "host",
                name,
                setting,
                "decode_step_period_ms",
                prof["step_period_ms"],
                output_tok_s=round(tps),
            )
