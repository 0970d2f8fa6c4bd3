"""Prefill chunk size on the CPU: the cost of one long prompt vs the stall it causes.

A stream of short decodes runs while one long prompt is prefilled in chunks of
`chunked_prefill_size` tokens. Per chunk size: the long prompt's prefill time
(throughput) and the longest gap between two tokens of the short stream (how
long everyone else waits), under both scheduling policies: mixed steps (the
stream decodes beside every chunk) and prefill first (chunks and decode steps
alternate). EngineConfig's per-device default (config.CPU_CHUNK) was chosen
from this table.

    python benchmarks/bench_prefill_chunk.py            # writes benchmarks/results/prefill_chunk_cpu.json
    python benchmarks/bench_prefill_chunk.py --quick    # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import environment, print_table, record, write_results  # noqa: E402

from radixserve import AsyncEngine, EngineConfig, SamplingParams  # noqa: E402

MODEL = "smollm2-135m-instruct"


async def one(chunk: int, mixed: bool, prompt_len: int, device: str) -> dict[str, Any]:
    cfg = EngineConfig(
        model=MODEL,
        device=device,
        chunked_prefill_size=chunk,
        mixed_steps=mixed,
        context_length=prompt_len + 64,
    )
    async with AsyncEngine(cfg) as eng:
        vocab = eng.loaded.config.vocab_size  # type: ignore[union-attr]
        rng = random.Random(0)
        long_ids = [rng.randrange(100, vocab) for _ in range(prompt_len)]
        await eng.complete([1, 2, 3], SamplingParams(max_tokens=2))  # warm up
        gaps: list[float] = []

        async def stream() -> None:
            last = time.perf_counter()
            p = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
            async for _ in eng.generate([5, 6, 7, 8], p):
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                if done.is_set():
                    return

        done = asyncio.Event()
        task = asyncio.create_task(stream())
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        await eng.complete(long_ids, SamplingParams(max_tokens=1))
        prefill_s = time.perf_counter() - t0
        done.set()
        await task
    gaps = gaps[1:]  # the first is the stream's time to first token
    return {
        "chunk": chunk,
        "policy": "mixed" if mixed else "prefill_first",
        "prompt_tokens": prompt_len,
        "prefill_s": prefill_s,
        "prefill_tok_per_s": prompt_len / prefill_s,
        "max_stall_s": max(gaps),
        "median_gap_s": statistics.median(gaps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "prefill_chunk_cpu.json"))
    args = ap.parse_args()
    env = environment()
    prompt_len = 512 if args.quick else 2048
    chunks = [128, 512] if args.quick else [256, 512, 1024, 2048]
    rows = [asyncio.run(one(c, m, prompt_len, args.device)) for c in chunks for m in (True, False)]
    keys = (
        "chunk",
        "policy",
        "prompt_tokens",
        "prefill_s",
        "prefill_tok_per_s",
        "max_stall_s",
        "median_gap_s",
    )
    print_table(
        ["chunk", "policy", "prompt tokens", "prefill s", "prefill tok/s", "max stall s", "median gap s"],
        [[r[k] for k in keys] for r in rows],
    )
    results = [record("prefill_chunk", MODEL, "float32", args.device, r) for r in rows]
    write_results(args.out, results, env)


if __name__ == "__main__":
    main()
