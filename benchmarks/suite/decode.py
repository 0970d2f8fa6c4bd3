"""W5 (shared-prefix decode) and the host time per decode step, from the worker probe.

W5 (BENCHMARKS.md, "Workloads"): a 4096-token random prefix is put in the cache
first (`max_tokens=0`), then N requests of the prefix plus 8 tokens of their
own decode 256 tokens each, once with shared-prefix (cascade) attention off
and once on (`EngineConfig.cascade_attention`), each in its own engine, in
one run. K/V bytes read per decode step are what the attention kernels read:
with cascade off the step's kv_indices length (every request's whole
context), with it on that less what the step's groups read once instead of
once per row (`CascadeGroups.saved_tokens`), times the pool's bytes per
token (K and V, all layers). Cascade steps run eagerly (no CUDA graph).

Decode attention time (`attention_ms_per_step`) is timed apart, on the
engine's own backend and pool while the engine is idle: the middle step's
shape (prefix + own + 128 tokens per row), every layer's forward (K/V write +
attention) between CUDA events, the plan (host) timed alone; on the CPU the
same with the wall clock.

Bounds (GPU only) are the bytes a step must read at 4.3 TB/s (the H200's measured copy rate):
the weights plus the K/V read.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import torch

from benchmarks.suite.context import Ctx
from benchmarks.suite.engines import greedy, run_offline, running_engine
from benchmarks.suite.probes import StepProbe, host_profile
from benchmarks.suite.workloads import worker_profile
from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch

HBM_BYTES_S = 4.3e12


def weight_bytes(engine: AsyncEngine) -> int:
    assert engine.loaded is not None
    return int(sum(p.numel() * p.element_size() for p in engine.loaded.model.parameters()))


def w5(ctx: Ctx, spec: str) -> None:
    """Cascade off, then on: one engine each, the same requests."""
    # The engine's defaults, lowered only for --quick's short prefix.
    min_shared = min(EngineConfig.cascade_min_shared, ctx.sizes.w5_prefix // 2)
    min_saved = min(EngineConfig.cascade_min_saved, ctx.sizes.w5_prefix)
    for cascade in (False, True):
        _w5(ctx, spec, cascade, min_shared, min_saved)


def _w5(ctx: Ctx, spec: str, cascade: bool, min_shared: int, min_saved: int) -> None:
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    vocab = t.vocab(spec)
    rng = random.Random(5)
    prefix = [rng.randrange(vocab) for _ in range(s.w5_prefix)]
    cfg = t.config(
        spec, cascade_attention=cascade, cascade_min_shared=min_shared, cascade_min_saved=min_saved
    )
    with running_engine(cfg) as (engine, loop):
        probe = StepProbe.attach(engine)
        per_token = engine.pool.config.bytes_per_slot  # type: ignore[union-attr]
        weights = weight_bytes(engine)
        run_offline(engine, loop, [(prefix[:64], 4), (prefix[64:128], 4)])  # warm-up
        for n in s.w5_ns:
            loop.run_until_complete(engine.flush_cache())
            loop.run_until_complete(engine.complete(prefix, SamplingParams(max_tokens=0)))
            reqs = [prefix + [rng.randrange(vocab) for _ in range(s.w5_own)] for _ in range(n)]
            before = loop.run_until_complete(engine.stats())
            probe.clear()

            async def go(reqs: list[list[int]] = reqs) -> list:
                return list(await asyncio.gather(*(engine.complete(r, greedy(s.w5_out)) for r in reqs)))

            t0 = time.perf_counter()
            outs = loop.run_until_complete(go())
            wall = time.perf_counter() - t0
            after = loop.run_until_complete(engine.stats())
            cached = sum(o.usage.cached_tokens for o in outs) / (n * s.w5_prefix)
            # Where admission staggered the N requests (on a loaded host one can finish before the
            # last arrives), the widest decode steps seen; `decode_batch` records which.
            steps = probe.decode_steps(n) or probe.widest_decode_steps()
            prof = host_profile(steps)
            setting = f"N={n} cascade={'on' if cascade else 'off'}"
            extra = {
                "prefix": s.w5_prefix,
                "decode_steps": len(steps),
                "decode_batch": steps[0].batch_size if steps else 0,
                "cascade_steps": after["cascade_steps"] - before["cascade_steps"],
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
                    source="len(kv_indices) - cascade groups' saved reads, per step",
                )
            else:
                print(f"[W5] no K/V figure: probe hooks missing {probe.missing}", flush=True)
            loop.run_until_complete(engine.flush_cache())  # the timing below writes into free slots
            att = attention_time(engine, n, s.w5_prefix, s.w5_own + s.w5_out // 2, cascade, min_shared)
            rec("W5", name, setting, "attention_ms_per_step", att["ms"], **att["extra"])


def device_ms(fn: Any, device: torch.device, replays: int = 1) -> tuple[float, str]:
    """Device ms of `fn`'s kernels, the median of `replays` runs: captured in a CUDA graph and
    replayed (so Python's launch cost between kernels is not counted, as inside the engine's
    decode graphs); where capture fails, the eager run between CUDA events."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        with torch.cuda.stream(stream):
            fn()  # warm-up on the capture stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        run = graph.replay
        how = "cuda graph of the layer loop"
    except RuntimeError as e:
        run = fn
        how = f"eager between CUDA events (capture failed: {str(e)[:80]})"
    torch.cuda.synchronize(device)
    times = []
    for _ in range(replays):
        begin.record()
        run()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times), how


def attention_time(
    engine: AsyncEngine, n: int, prefix: int, own: int, cascade: bool, min_shared: int, repeats: int = 10
) -> dict[str, Any]:
    """Every layer's attention (K/V write included) for W5's middle step on the engine's
    backend and pool (the engine idle, its cache flushed): median ms over `repeats`."""
    worker: Any = engine._worker  # private on purpose: the suite times the backend itself
    attn = worker.runner.attn
    pool = engine.pool
    assert pool is not None and engine.loaded is not None
    mc = engine.loaded.config
    device = torch.device(pool.config.device)
    shared = torch.arange(prefix)
    ctx = [torch.cat([shared, prefix + i * own + torch.arange(own)]) for i in range(n)]
    fb = ForwardBatch.build(
        torch.zeros(n, dtype=torch.int64), [1] * n, [len(c) - 1 for c in ctx], ctx, device
    )
    use = cascade and attn.supports_cascade and prefix >= min_shared
    if use:
        fb.cascade = CascadeGroups((tuple(range(n)),), (prefix,))
    dtype = pool.config.dtype
    q = torch.randn(n, mc.num_heads, mc.head_dim, device=device, dtype=dtype)
    kv = torch.randn(n, mc.num_kv_heads, mc.head_dim, device=device, dtype=dtype)
    layers = mc.num_layers
    plan_s: list[float] = []
    step_ms: list[float] = []

    def all_layers() -> None:
        for layer in range(layers):
            attn.forward(q, kv, kv, layer, fb)

    timing = "wall clock"
    with torch.inference_mode():
        for i in range(repeats + 2):  # two warm-ups
            t0 = time.perf_counter()
            attn.plan(fb)
            plan_s.append(time.perf_counter() - t0)
            if device.type == "cuda":
                ms, timing = device_ms(all_layers, device)
            else:
                t1 = time.perf_counter()
                for layer in range(layers):
                    attn.forward(q, kv, kv, layer, fb)
                ms = 1000 * (time.perf_counter() - t1)
            if i >= 2:
                step_ms.append(ms)
    return {
        "ms": statistics.median(step_ms),
        "extra": {
            "definition": f"{layers} layers' attention forward (K/V write + attention), plan excluded",
            "timing": timing,
            "plan_ms": round(1000 * statistics.median(plan_s[2:]), 4),
            "backend": attn.name,
            "cascade_used": use,
            "kv_tokens_per_layer": fb.cascade.kv_tokens_read(fb.seq_lens) if fb.cascade else sum(fb.seq_lens),
        },
    }


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
            steps = probe.decode_steps(bs) or probe.widest_decode_steps()  # as in W5
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
                decode_batch=steps[0].batch_size,
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
