"""Two questions an operator of a radix-cache engine asks: which page size, which prefill chunk.

Page size (`EngineConfig.page_size`, the radix tree's matching granularity;
the KV pool itself hands out one slot per token): W2's hit rate and its
multi-turn variant (a turn can reuse only whole pages of the history),
decode speed, and KV memory lost to fragmentation, measured two ways:

- `kv_slots_lost`: slots in use that hold no cached token once every request
  has ended (`stats()`: total - free - cached). The pool is token-granular,
  so partial pages are freed, not held: this is expected to be 0;
- `paged_pool_waste_frac`: what a pool that allocated whole pages would have
  lost at each decode step: sum(ceil(len/P)*P - len) / sum(ceil(len/P)*P)
  over the running requests' context lengths seen by the step probe
  (arithmetic on measured lengths, not a measured allocation).

Chunked prefill (`EngineConfig.chunked_prefill_size`): W1 throughput, and
W4's TTFT and time between tokens at one Poisson rate for every size (90% of
the W1 request rate of this run), so that the sizes meet the same load.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics

from benchmarks.common import best_hit_rate, w1_requests, w2_requests
from benchmarks.suite.context import Ctx
from benchmarks.suite.engines import (
    greedy,
    one,
    p50_p99_ms,
    run_offline,
    run_streaming,
    running_engine,
    stats,
)
from benchmarks.suite.probes import StepProbe, host_profile
from benchmarks.suite.workloads import poisson_delays
from radixserve import AsyncEngine


def multi_turn_best(turns: int, tok: int) -> float:
    """Best hit rate of one conversation: turn k can reuse all but the last generated token of k-1."""
    prompt = sum(k * 2 * tok - tok for k in range(1, turns + 1))
    reusable = sum((k - 1) * 2 * tok - 1 for k in range(2, turns + 1))
    return reusable / prompt


def multi_turn(
    engine: AsyncEngine, loop: asyncio.AbstractEventLoop, n: int, turns: int, tok: int, vocab: int
) -> tuple[float, float]:
    """n conversations at once, each `turns` turns of `tok` user tokens then `tok` generated.

    Returns (hit rate from usage, output tok/s)."""
    import time

    async def conv(i: int) -> tuple[int, int]:
        rng = random.Random(100 + i)  # per conversation: the same ids whatever the interleaving
        hist: list[int] = []
        prompt = cached = 0
        for _ in range(turns):
            hist = hist + [rng.randrange(vocab) for _ in range(tok)]
            out = one(await engine.complete(hist, greedy(tok)))
            prompt += out.usage.prompt_tokens
            cached += out.usage.cached_tokens
            hist = hist + list(out.token_ids)
        return prompt, cached

    async def go() -> list[tuple[int, int]]:
        return list(await asyncio.gather(*(conv(i) for i in range(n))))

    t0 = time.perf_counter()
    res = loop.run_until_complete(go())
    wall = time.perf_counter() - t0
    return sum(c for _, c in res) / sum(p for p, _ in res), n * turns * tok / wall


def paged_waste(kv_lens: list[int], page: int) -> float:
    held = sum(math.ceil(n / page) * page for n in kv_lens)
    return (held - sum(kv_lens)) / held if held else 0.0


def pages(ctx: Ctx, spec: str) -> None:
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    vocab = t.vocab(spec)
    prefix, n, q, out = s.w2
    w2 = w2_requests(prefix, n, q, out, vocab)
    convs, turns, tok = s.w2_turns
    dn, dprompt, dout = s.page_decode
    rng = random.Random(7)
    decode_reqs = [([rng.randrange(vocab) for _ in range(dprompt)], dout) for _ in range(dn)]
    for page in s.page_sizes:
        setting = f"page={page}"
        with running_engine(t.config(spec, page_size=page)) as (engine, loop):
            probe = StepProbe.attach(engine)
            run_offline(engine, loop, [(r[0][-64:], 4) for r in w2[:4]])  # warm-up, unrelated prefix
            loop.run_until_complete(engine.flush_cache())
            base = stats(engine, loop)
            w2_tps = run_offline(engine, loop, w2)
            st = stats(engine, loop)
            hit = (st["prompt_tokens_cached"] - base["prompt_tokens_cached"]) / (
                st["prompt_tokens"] - base["prompt_tokens"]
            )
            loop.run_until_complete(engine.flush_cache())
            mt_hit, mt_tps = multi_turn(engine, loop, convs, turns, tok, vocab)
            loop.run_until_complete(engine.flush_cache())
            probe.clear()
            dec_tps = run_offline(engine, loop, decode_reqs)
            # Decode steps of all dn requests; where admission staggered them (a request that
            # arrived a step late finishes alone), the widest decode steps seen. After the last
            # prefill only decode steps remain, so this list is never empty.
            steps = probe.decode_steps(dn) or probe.widest_decode_steps()
            end = stats(engine, loop)
            loop.run_until_complete(engine.check_integrity())
        rec(
            "pages",
            name,
            setting,
            "w2_hit_rate",
            hit,
            bound=round(best_hit_rate(n, prefix, q), 5),
            output_tok_s=round(w2_tps),
        )
        rec(
            "pages",
            name,
            setting,
            "multi_turn_hit_rate",
            mt_hit,
            bound=round(multi_turn_best(turns, tok), 5),
            output_tok_s=round(mt_tps),
            conversations=convs,
            turns=turns,
            tokens_per_turn=tok,
        )
        prof = host_profile(steps)
        rec(
            "pages",
            name,
            setting,
            "decode_output_tok_s",
            dec_tps,
            requests=dn,
            prompt=dprompt,
            output=dout,
            step_period_ms=round(prof["step_period_ms"], 4) if prof else None,
        )
        lost = end["total_slots"] - end["free_slots"] - end["cached_tokens"]
        rec(
            "pages",
            name,
            setting,
            "kv_slots_lost",
            lost,
            total_slots=end["total_slots"],
            source="stats() after all requests ended",
        )
        lens = [x.kv_lens for x in steps if x.kv_lens]
        if lens:
            waste = statistics.median(paged_waste(ls, page) for ls in lens)
            rec(
                "pages",
                name,
                setting,
                "paged_pool_waste_frac",
                waste,
                source="arithmetic on the decode steps' context lengths, if whole pages were allocated",
            )


def chunks(ctx: Ctx, spec: str) -> None:
    t, s, rec = ctx.target, ctx.sizes, ctx.rec
    name = t.name(spec)
    reqs = w1_requests(s.chunk_n, s.w1_lo, s.w1_hi, t.vocab(spec))
    mean_out = statistics.fmean(n for _, n in reqs)
    rate: float | None = None
    why = ""
    if name in ctx.w1_tok_s:  # this run's full W1, as W4 uses
        rate = 0.9 * ctx.w1_tok_s[name] / mean_out
        why = f"0.9 * W1 {ctx.w1_tok_s[name]:.0f} tok/s / mean output {mean_out:.1f}"
    for c in s.chunk_sizes:
        setting = f"chunk={c}"
        # stream_interval_ms=0: W4's time between tokens, as in workloads.w4
        with running_engine(t.config(spec, chunked_prefill_size=c, stream_interval_ms=0)) as (engine, loop):
            run_offline(engine, loop, reqs[:8])
            loop.run_until_complete(engine.flush_cache())
            w1_tps = run_offline(engine, loop, reqs)
            if rate is None:  # the first size's W1 here sets the one rate for all sizes
                rate = 0.9 * w1_tps / mean_out
                why = f"0.9 * W1 ({len(reqs)} requests, {setting}) {w1_tps:.0f} tok/s"
                why += f" / mean output {mean_out:.1f}"
            loop.run_until_complete(engine.flush_cache())
            streamed = run_streaming(engine, loop, reqs, poisson_delays(len(reqs), rate))
        rec("chunks", name, setting, "w1_output_tok_s", w1_tps, requests=len(reqs))
        for metric, xs in (("ttft", streamed.ttft), ("tbt", streamed.tbt)):
            p50, p99 = p50_p99_ms(xs)
            rec("chunks", name, setting, f"w4_{metric}_p50_ms", p50, rate=round(rate, 3), rate_from=why)
            rec("chunks", name, setting, f"w4_{metric}_p99_ms", p99)
