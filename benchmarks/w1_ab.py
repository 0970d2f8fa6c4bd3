"""W1 on two source trees in one run: `complete()` and streaming output tok/s, A/B, alternating.

Each (tree, round) runs in its own process with that tree first on PYTHONPATH, so a change
is measured against its base on one machine in one sitting (the way BENCHMARKS.md wants
ratios). W1 is the suite's (256 requests, lengths uniform in [100, 1024], greedy, EOS
ignored), on dummy weights of a published shape.

    python benchmarks/w1_ab.py --base /tmp/base-checkout --model dummy:qwen2.5-0.5b \\
        --rounds 2 --out $OUT/w1_ab.json          # on a GPU (bfloat16)
    python benchmarks/w1_ab.py --base /tmp/base-checkout --quick   # any CPU: a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(model: str, device: str, n: int, lo: int, hi: int) -> dict[str, float]:
    """One engine of the tree on sys.path: W1 complete(), then W1 streamed."""
    sys.path.append(str(ROOT))  # benchmarks.common, after the tree's radixserve
    from benchmarks.common import w1_requests
    from radixserve import AsyncEngine, EngineConfig, SamplingParams

    dtype = "bfloat16" if device == "cuda" else "float32"
    cfg = EngineConfig(model=model, device=device, dtype=dtype)

    def greedy(k: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)

    async def run() -> dict[str, float]:
        async with AsyncEngine(cfg) as engine:
            vocab = engine.loaded.config.vocab_size  # type: ignore[union-attr]
            reqs = w1_requests(n, lo, hi, vocab)
            await asyncio.gather(*(engine.complete(ids, greedy(k)) for ids, k in reqs[:8]))  # warm-up
            await engine.flush_cache()
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(engine.complete(ids, greedy(k)) for ids, k in reqs))
            done = sum(len(o.token_ids) for o in outs)  # type: ignore[union-attr]
            complete_tok_s = done / (time.perf_counter() - t0)
            await engine.flush_cache()

            async def stream(ids: list[int], k: int) -> int:
                return sum([len(o.delta_token_ids) async for o in engine.generate(ids, greedy(k))])

            t0 = time.perf_counter()
            streamed = sum(await asyncio.gather(*(stream(ids, k) for ids, k in reqs)))
            return {"complete_tok_s": complete_tok_s, "stream_tok_s": streamed / (time.perf_counter() - t0)}

    return asyncio.run(run())


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, __file__, "--child", "--model", args.model, "--device", args.device]
    cmd += ["--n", str(args.n), "--lo", str(args.lo), "--hi", str(args.hi)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{tree}: child failed\n{out.stderr[-4000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="the source tree to compare against (a checkout)")
    ap.add_argument("--model", default="dummy:qwen2.5-0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--lo", type=int, default=100)
    ap.add_argument("--hi", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="CPU, embedded model, 8 short requests")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.model, args.device, args.n, args.lo, args.hi, args.rounds = (
            "smollm2-135m-instruct",
            "cpu",
            8,
            8,
            16,
            1,
        )
    if args.child:
        print(json.dumps(child(args.model, args.device, args.n, args.lo, args.hi)))
        return
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(run_tree(tree, args))
    print(
        f"W1 {args.model} on {args.device}, {args.n} requests, {args.rounds} round(s) per tree, alternating"
    )
    print(
        "| tree | complete() tok/s (each round) | streaming tok/s (each round) | median stream / complete |"
    )
    print("|------|------------------------------|------------------------------|--------------------------|")
    for name, rs in runs.items():
        comp = [r["complete_tok_s"] for r in rs]
        strm = [r["stream_tok_s"] for r in rs]
        ratio = statistics.median(strm) / statistics.median(comp)
        cells = ", ".join(f"{x:,.0f}" for x in comp), ", ".join(f"{x:,.0f}" for x in strm)
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
    if args.out:
        args.out.write_text(
            json.dumps({"model": args.model, "device": args.device, "runs": runs}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
