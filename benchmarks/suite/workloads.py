"""W1-W4 (BENCHMARKS.md, "Workloads") through the public API, with the transformers peer in W1."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from benchmarks.common import best_hit_rate, w1_requests, w2_requests
from benchmarks.suite.bounds import DEFAULT_TB_S, peak_tb_s, w1_bound
from benchmarks.suite.context import Ctx
from benchmarks.suite.engines import (
    greedy,
    hf_config,
    p50_p99_ms,
    run_offline,
    run_streaming,
    running_engine,
    stats,
)
from benchmarks.suite.peer import hf_peer, sweep
from radixserve import AsyncEngine
from radixserve.sched.messages import ProfileWorker

BOUNDS = {"llama-3.1-8b": 13600.0, "qwen2.5-0.5b": 187000.0}  # BENCHMARKS.md, W1 on one H200
TARGETS = {"llama-3.1-8b": 11500.0, "qwen2.5-0.5b": 100000.0}  # issue 11


@contextmanager
def worker_profile(engine: AsyncEngine, on: bool) -> Iterator[None]:
    """cProfile the worker thread (where host time per step goes), printed after."""
    if not on:
        yield
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    engine._worker.submit(ProfileWorker(prof, on=True))  # type: ignore[union-attr]
    yield
    engine._worker.submit(ProfileWorker(prof, on=False))  # type: ignore[union-attr]
    time.sleep(0.2)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def w1(ctx: Ctx, spec: str) -> None:
    """W1 with `complete()` and streaming; the peer's sweep on a capped subset, radixserve on it too."""
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    reqs = w1_requests(s.w1_n, s.w1_lo, s.w1_hi, t.vocab(spec))
    sub = [(ids, min(n, s.peer_max_out)) for ids, n in reqs[: s.peer_n]]
    with running_engine(t.config(spec)) as (engine, loop):
        run_offline(engine, loop, reqs[:8])  # warm-up: kernels, allocator
        loop.run_until_complete(engine.flush_cache())
        with worker_profile(engine, ctx.profile):
            tps = run_offline(engine, loop, reqs)
        loop.run_until_complete(engine.flush_cache())
        streamed = run_streaming(engine, loop, reqs)
        loop.run_until_complete(engine.flush_cache())
        sub_tps = run_offline(engine, loop, sub)
    ctx.w1_tok_s[name] = tps
    mean_out = statistics.fmean(n for _, n in reqs)
    # The documented bounds where there is one (for the model dtype); else the bytes a step
    # reads (suite/bounds.py), FP8 linears at one byte a weight.
    tb_s = peak_tb_s(torch.cuda.get_device_name()) if torch.cuda.is_available() else DEFAULT_TB_S
    documented = name in BOUNDS and t.quantization is None and tb_s == DEFAULT_TB_S
    computed = (
        None
        if documented
        else round(w1_bound(hf_config(spec), reqs, hbm_tb_s=tb_s, quantization=t.quantization))
    )
    rec(
        "W1",
        name,
        "radixserve complete()",
        "output_tok_s",
        tps,
        bound=BOUNDS[name] if documented else computed,
        bound_source="BENCHMARKS.md" if computed is None else f"suite/bounds.py at {tb_s} TB/s",
        target=TARGETS.get(name),
    )
    # The streams' output spacing: tokens per output, and the time floor between outputs.
    every = {"stream_interval": t.stream_interval, "stream_interval_ms": t.config(spec).stream_interval_ms}
    rec("W1", name, "radixserve streaming", "output_tok_s", streamed.tok_s, target=TARGETS.get(name), **every)
    rec("W1", name, "streaming/complete()", "ratio", streamed.tok_s / tps, target=0.9, **every)
    for metric, xs in (("ttft", streamed.ttft), ("tbt", streamed.tbt)):
        p50, p99 = p50_p99_ms(xs)
        rec("W1", name, "radixserve streaming", f"{metric}_p50_ms", p50)
        rec("W1", name, "radixserve streaming", f"{metric}_p99_ms", p99)
    rec("W1", name, "workload", "mean_output_len", mean_out, requests=len(reqs))

    hf = hf_peer(t, spec)
    res = sweep(hf, sub, list(s.peer_batches), t.device, s.peer_budget_s)
    del hf
    subset = f"first {len(sub)} W1 requests, outputs capped at {s.peer_max_out}"
    for b, v in sorted(res.tok_s.items()):
        rec(
            "W1-peer",
            name,
            f"transformers generate batch={b}",
            "output_tok_s",
            v,
            subset=subset,
            tokens_computed=res.computed[b],
            warmed=True,
        )
    for b, why in res.skipped.items():
        print(f"[W1-peer] {name} batch={b} skipped: {why}", flush=True)
    if not res.tok_s:  # every batch size ran out of memory: no peer figure, said so above
        return
    best = res.tok_s[res.best]
    rec("W1-peer", name, "radixserve complete()", "output_tok_s", sub_tps, subset=subset)
    rec(
        "W1-peer",
        name,
        f"radixserve/transformers best (batch={res.best})",
        "ratio",
        sub_tps / best,
        subset=subset,
        swept=sorted(res.tok_s),
        skipped=res.skipped or None,
        peer_seconds=round(res.seconds, 1),
    )
    rec(
        "W1",
        name,
        f"radixserve full W1 / transformers best on the subset (batch={res.best})",
        "ratio",
        tps / best,
        target=15.0,
    )


def w1_sampled(ctx: Ctx, spec: str) -> None:
    """W1 sampled (temperature 0.8, top_p 0.95, seeded: engines.sampled) beside greedy W1 on the
    same engine and card, so the ratio is what sampling costs (sampled CUDA graphs on GPUs)."""
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    reqs = w1_requests(s.w1_n, s.w1_lo, s.w1_hi, t.vocab(spec))
    tps: dict[bool, float] = {}
    with running_engine(t.config(spec)) as (engine, loop):
        run_offline(engine, loop, reqs[:8], sample=True)  # warm-up: kernels, allocator
        for sample in (False, True):
            loop.run_until_complete(engine.flush_cache())
            tps[sample] = run_offline(engine, loop, reqs, sample=sample)
    setting = "radixserve complete() temperature=0.8 top_p=0.95 seeded"
    rec("W1-sampled", name, setting, "output_tok_s", tps[True], requests=len(reqs))
    rec("W1-sampled", name, "radixserve complete() greedy, same engine", "output_tok_s", tps[False])
    rec("W1-sampled", name, "sampled/greedy", "ratio", tps[True] / tps[False])


def w2(ctx: Ctx, spec: str) -> None:
    t, rec = ctx.target, ctx.rec
    name = t.name(spec)
    prefix, n, q, out = ctx.sizes.w2
    reqs = w2_requests(prefix, n, q, out, t.vocab(spec))
    tps = {}
    for radix in (True, False):
        with running_engine(t.config(spec, enable_radix_cache=radix)) as (engine, loop):
            run_offline(engine, loop, [(r[0][-64:], 4) for r in reqs[:4]])  # warm-up, unrelated prefix
            loop.run_until_complete(engine.flush_cache())
            base = stats(engine, loop)
            tps[radix] = run_offline(engine, loop, reqs)
            st = stats(engine, loop)
        setting = f"radix={'on' if radix else 'off'}"
        rec("W2", name, setting, "output_tok_s", tps[radix])
        if radix:
            hit = (st["prompt_tokens_cached"] - base["prompt_tokens_cached"]) / (
                st["prompt_tokens"] - base["prompt_tokens"]
            )
            best = best_hit_rate(n, prefix, q)
            rec("W2", name, setting, "hit_rate", hit, bound=round(best, 5))
            rec("W2", name, setting, "hit_rate_of_best", hit / best, target=0.99)
    rec("W2", name, "radix on/off", "ratio", tps[True] / tps[False], target=6.0)


def gpu_idle_fraction(engine: AsyncEngine, loop: asyncio.AbstractEventLoop, vocab: int, bs: int) -> float:
    """Share of wall time with no kernel running, over a window of pure decode steps."""
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(3)
    prompts = [[rng.randrange(vocab) for _ in range(256)] for _ in range(bs)]

    async def go() -> float:
        started = asyncio.Event()
        firsts = 0

        async def one(p: list[int]) -> None:
            nonlocal firsts
            async for out in engine.generate(p, greedy(400)):
                if len(out.token_ids) == 1:
                    firsts += 1
                    if firsts == bs:
                        started.set()

        tasks = [asyncio.create_task(one(p)) for p in prompts]
        await started.wait()
        await asyncio.sleep(0.2)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            await asyncio.sleep(0.5)
            torch.cuda.synchronize()
        await asyncio.gather(*tasks)
        spans = sorted(
            (e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
        )
        busy, cur_s, cur_e = 0.0, 0.0, None
        for a, b in spans:
            if cur_e is None or a > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = a, b
            else:
                cur_e = max(cur_e, b)
        if cur_e is not None:
            busy += cur_e - cur_s
        return 1.0 - busy / (spans[-1][1] - spans[0][0])

    return loop.run_until_complete(go())


def w3(ctx: Ctx, spec: str) -> None:
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    reqs = w1_requests(s.w1_n, s.w1_lo, s.w1_hi, t.vocab(spec))
    tps = {}
    for overlap in (True, False):
        with running_engine(t.config(spec, overlap=overlap)) as (engine, loop):
            run_offline(engine, loop, reqs[:8])
            loop.run_until_complete(engine.flush_cache())
            tps[overlap] = run_offline(engine, loop, reqs)
            idle = (
                gpu_idle_fraction(engine, loop, t.vocab(spec), s.w3_idle_bs) if t.device == "cuda" else None
            )
        setting = f"overlap={'on' if overlap else 'off'}"
        rec("W3", name, setting, "output_tok_s", tps[overlap])
        if idle is not None:
            rec("W3", name, setting, "gpu_idle_frac", idle, target=0.05 if overlap else None)
    rec("W3", name, "overlap on/off", "ratio", tps[True] / tps[False])


def saturation_rate(
    ctx: Ctx, spec: str, engine: AsyncEngine, loop: asyncio.AbstractEventLoop
) -> tuple[float, str]:
    """90% of the W1 request rate: W1 tok/s (this run's, measured here if W1 did not run) / mean W1 output."""
    s = ctx.sizes
    name = ctx.target.name(spec)
    reqs = w1_requests(s.w1_n, s.w1_lo, s.w1_hi, ctx.target.vocab(spec))
    if name not in ctx.w1_tok_s:
        loop.run_until_complete(engine.flush_cache())
        ctx.w1_tok_s[name] = run_offline(engine, loop, reqs)
        loop.run_until_complete(engine.flush_cache())
    mean_out = statistics.fmean(n for _, n in reqs)
    tps = ctx.w1_tok_s[name]
    return 0.9 * tps / mean_out, f"0.9 * W1 {tps:.0f} tok/s / mean W1 output {mean_out:.1f}"


def poisson_delays(n: int, rate: float, seed: int = 4) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


POLICIES = {"mixed": True, "prefill_first": False}  # EngineConfig.mixed_steps, the default first


def w4(ctx: Ctx, spec: str) -> None:
    """Near saturation (90% of the W1 request rate), then at each of `Sizes.w4_rates` (req/s), under
    each scheduling policy (mixed steps against prefill first), with W1 throughput under each."""
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    reqs = w1_requests(s.w4_n, s.w1_lo, s.w1_hi, t.vocab(spec))
    w1_reqs = w1_requests(s.w1_n, s.w1_lo, s.w1_hi, t.vocab(spec))
    rates: list[tuple[float, str]] = []
    runs = []
    for policy, mixed in POLICIES.items():
        # Every token its own output (stream_interval_ms=0): W4 times the scheduler's steps, which
        # a time floor between outputs would average with their neighbours (TBT below).
        with running_engine(t.config(spec, mixed_steps=mixed, stream_interval_ms=0)) as (engine, loop):
            run_offline(engine, loop, reqs[:8])
            loop.run_until_complete(engine.flush_cache())
            w1_tps = run_offline(engine, loop, w1_reqs)
            rec("W4", name, f"{policy}: W1 complete()", "output_tok_s", w1_tps)
            if not rates:  # one set of rates for both policies: the default's saturation
                ctx.w1_tok_s.setdefault(name, w1_tps)
                rates = [saturation_rate(ctx, spec, engine, loop), *((x, "fixed") for x in s.w4_rates)]
            for r, src in rates:
                loop.run_until_complete(engine.flush_cache())
                runs.append((policy, r, src, run_streaming(engine, loop, reqs, poisson_delays(len(reqs), r))))
    for policy, r, src, streamed in runs:
        for metric, xs in (("ttft", streamed.ttft), ("tbt", streamed.tbt)):
            p50, p99 = p50_p99_ms(xs)
            setting = f"{policy}: rate={r:.2f}/s"
            rec("W4", name, setting, f"{metric}_p50_ms", p50, rate_from=src)
            rec("W4", name, setting, f"{metric}_p99_ms", p99, target=3 * p50 if metric == "tbt" else None)
