"""What `EngineConfig(deterministic=True)` costs on the CPU: output tokens per second of the
embedded model, deterministic against default, for one request alone and a batch.

    python benchmarks/bench_deterministic.py [--requests 16] [--prompt 64] [--tokens 24] [--rounds 3]
        [--out FILE]

Each mode runs in one engine, `--rounds` times over; a figure is the best round (the CPU is
shared: the best round is the least disturbed). Prints a table and one JSON line, and with
`--out` writes the JSON with the run's provenance. On a GPU, the suite's `--deterministic`
(gpu_suite.py) measures W1 and the rest the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import environment, write_results  # noqa: E402

from radixserve import AsyncEngine, EngineConfig, SamplingParams  # noqa: E402


def _prompts(n: int, length: int) -> list[list[int]]:
    # Distinct token ids per prompt: no radix-cache hits between them.
    return [[1 + (i * 7919 + j * 104729) % 40000 for j in range(length)] for i in range(n)]


async def _measure(cfg: EngineConfig, prompts: list[list[int]], tokens: int, rounds: int) -> dict[str, float]:
    """The best of `rounds` runs of one request alone and of the rest as one batch."""
    sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    alone = batch = 0.0
    async with AsyncEngine(cfg) as engine:
        await engine.complete(prompts[0][:8], SamplingParams(temperature=0.0, max_tokens=2))  # warm-up
        for _ in range(rounds):
            t = time.perf_counter()
            await engine.complete(prompts[0], sp)
            alone = max(alone, tokens / (time.perf_counter() - t))
            t = time.perf_counter()
            outs = await asyncio.gather(*(engine.complete(p, sp) for p in prompts[1:]))
            batch = max(batch, sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t))
    return {"alone_tok_s": alone, "batch_tok_s": batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16, help="the batch (plus one request alone)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    ap.add_argument("--tokens", type=int, default=24, help="output tokens per request")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=3, help="runs per mode; the best is reported")
    ap.add_argument("--out", help="write the JSON here too, with the run's provenance")
    args = ap.parse_args()
    env = environment()
    torch.set_num_threads(args.threads)
    prompts = _prompts(args.requests + 1, args.prompt)
    rows = {}
    for det in (False, True):
        cfg = EngineConfig(device="cpu", dtype="float32", deterministic=det, enable_radix_cache=False)
        rows["deterministic" if det else "default"] = asyncio.run(
            _measure(cfg, prompts, args.tokens, args.rounds)
        )
    base, det_row = rows["default"], rows["deterministic"]
    print(f"{'mode':<14}{'alone tok/s':>14}{'batch tok/s':>14}")
    for mode, r in rows.items():
        print(f"{mode:<14}{r['alone_tok_s']:>14.1f}{r['batch_tok_s']:>14.1f}")
    cost = {k: base[k] / det_row[k] for k in base}
    print(f"{'slowdown':<14}{cost['alone_tok_s']:>13.2f}x{cost['batch_tok_s']:>13.2f}x")
    doc = {"bench": "deterministic_cpu", "args": vars(args), "modes": rows, "slowdown": cost}
    print(json.dumps(doc))
    if args.out:
        print(f"wrote {write_results(args.out, [doc], env)}")


if __name__ == "__main__":
    main()
