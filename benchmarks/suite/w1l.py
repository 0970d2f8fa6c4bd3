"""W1L (BENCHMARKS.md): TensorRT-LLM's published throughput protocol, so a figure stands beside
theirs on the same GPU: N requests of exactly ISL random token ids in and OSL tokens out (greedy,
EOS ignored), all queued at once, `complete()`; output tok/s from first submit to last token.

Settings `ISL/OSL:N` (`Sizes.w1l`; `gpu_suite.py --w1l 1000/1000:1000` for a quick look):
1000/1000 with N = 3000 and 128/128 with N = 30000 as published. Records are named by the
setting ("1000/1000", "1000/1000 fp8" with `--quantization fp8`), each with the KV pool's
capacity in tokens beside it (`kv_total_slots`: an FP8 KV cache, `--set kv_cache_dtype=fp8_e4m3`,
should hold ~2x the tokens of bf16 in the same memory), the engine's `max_running_requests`, and
the requests the setting retracted (sent back to the queue when the pool ran dry: their KV
recomputed or re-read, so a wider batch that retracts can lose to a narrower one).
"""

from __future__ import annotations

import random

from benchmarks.suite.context import Ctx
from benchmarks.suite.engines import run_offline, running_engine

# Output tok/s TensorRT-LLM publishes for Llama-3.1-8B FP8 on one H200 (perf-overview.md), and
# the bf16 target of 1000/1000 that radixserve sets itself: what the records carry as target.
PUBLISHED_FP8 = {(1000, 1000): 17744.0, (128, 128): 27911.0}
BF16_TARGET = {(1000, 1000): 12000.0}
# A progress line this often: a setting takes minutes, and one cut off by a timeout says how far it got.
PROGRESS_S = 30.0


def w1l_requests(n: int, isl: int, osl: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """N prompts of exactly `isl` token ids drawn uniformly from the vocabulary, `osl` out each."""
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(isl)], osl) for _ in range(n)]


def parse_settings(text: str) -> tuple[tuple[int, int, int], ...]:
    """ "1000/1000:3000,128/128:30000" -> ((1000, 1000, 3000), (128, 128, 30000))."""
    out = []
    for part in filter(None, text.split(",")):
        lengths, _, n = part.partition(":")
        isl, _, osl = lengths.partition("/")
        if not (isl.isdigit() and osl.isdigit() and n.isdigit()):
            raise ValueError(f"W1L setting {part!r}: write ISL/OSL:N, e.g. 1000/1000:3000")
        out.append((int(isl), int(osl), int(n)))
    return tuple(out)


def w1l(ctx: Ctx, spec: str) -> None:
    """Each W1L setting of `ctx.sizes` on one engine, the cache flushed between them."""
    t, rec = ctx.target, ctx.rec
    name, vocab = t.name(spec), t.vocab(spec)
    targets = PUBLISHED_FP8 if t.quantization == "fp8" else BF16_TARGET
    with running_engine(t.config(spec)) as (engine, loop):
        run_offline(engine, loop, w1l_requests(8, 64, 16, vocab, seed=1))  # warm-up: kernels, allocator
        slots = loop.run_until_complete(engine.stats())["total_slots"]
        for isl, osl, n in ctx.sizes.w1l:
            loop.run_until_complete(engine.flush_cache())
            before = loop.run_until_complete(engine.stats())["retractions"]
            tps = run_offline(engine, loop, w1l_requests(n, isl, osl, vocab), progress_s=PROGRESS_S)
            retracted = loop.run_until_complete(engine.stats())["retractions"] - before
            rec(
                "W1L",
                name,
                f"{isl}/{osl}",
                "output_tok_s",
                tps,
                target=targets.get((isl, osl)),
                requests=n,
                kv_total_slots=slots,
                max_running_requests=engine.config.max_running_requests,
                retractions=retracted,
            )
