"""Replicas and routing: W8 (shared prefix) across replicas, and the router's cost on W1.

    python benchmarks/bench_replicas.py                  # CPU: W8 4x6 (200-token prefixes), W1-cpu
    python benchmarks/bench_replicas.py --quick          # a smoke run
    python benchmarks/bench_replicas.py --device cuda --model dummy:qwen2.5-0.5b --load-format dummy --only w1
    python benchmarks/bench_replicas.py --device cuda --model dummy:llama-3.1-8b --load-format dummy \\
        --only w8 --groups 64 --per-group 16 --prefix 2048 --replicas 8

W8 (BENCHMARKS.md): G groups of R requests, each its group's random prefix plus
`--question` random tokens of its own, `--out-len` tokens out (greedy, EOS
ignored), groups interleaved in arrival order (one request of each group in
turn), all submitted at once through `complete()`. Run by one engine, by N
replicas behind the cache-aware router and by N replicas in round-robin, one
after another, each on a fresh engine warmed up by an unrelated request and
flushed. Figures: cached prompt tokens (`Usage.cached_tokens`) against the ideal
G·(R−1)·P and against one engine's, output tok/s, and the router's decisions.
Choose N coprime with G: round-robin over interleaved groups otherwise sends each
group to one replica by accident.

W1 (router overhead): the plain engine and `data_parallel_size=1` (one engine
behind the router) both up at once, in interleaved rounds, `complete()` and
streaming; the best of `--repeats` rounds each; ratio replicated / plain. Both
KV pools are sized for the workload (`--kv-cache-tokens`, default 1.25x its
tokens) so the two fit one GPU.

Prints tables; writes JSON (default benchmarks/results/replicas_<device>.json).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    Request,
    environment,
    print_table,
    record,
    w1_requests,
    w8_requests,
    write_results,
)

from radixserve import AsyncEngine, EngineConfig, SamplingParams  # noqa: E402
from radixserve.config import RouterConfig  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_replicas] {msg}", file=sys.stderr, flush=True)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


async def offline(engine: AsyncEngine, reqs: Sequence[Request]) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.complete(ids, greedy(n)) for ids, n in reqs))
    return time.perf_counter() - t0, outs


async def streaming(engine: AsyncEngine, reqs: Sequence[Request]) -> tuple[float, int]:
    async def one(ids: list[int], n: int) -> int:
        got = 0
        async for out in engine.generate(ids, greedy(n)):
            got += len(out.delta_token_ids)
        return got

    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(ids, n) for ids, n in reqs))
    return time.perf_counter() - t0, sum(tokens)


def base_config(args: argparse.Namespace, **kw: Any) -> EngineConfig:
    cfg: dict[str, Any] = dict(
        model=args.model, device=args.device, dtype=args.dtype, load_format=args.load_format
    )
    if args.kv_cache_tokens is not None:
        cfg["kv_cache_tokens"] = args.kv_cache_tokens
    cfg.update(kw)
    return EngineConfig(**cfg)


async def vocab_of(args: argparse.Namespace) -> int:
    async with AsyncEngine(base_config(args, kv_cache_tokens=args.kv_cache_tokens or 4096)) as engine:
        assert engine.loaded is not None
        return int(engine.loaded.config.vocab_size)


async def w8_one(cfg: EngineConfig, reqs: list[list[int]], out_len: int, repeats: int) -> dict[str, Any]:
    async with AsyncEngine(cfg) as engine:
        await engine.complete([1, 2, 3], greedy(2))  # warm-up, unrelated to the workload
        assert await engine.flush_cache()
        runs, cached, tokens = [], [], None
        for _ in range(repeats):
            wall, outs = await offline(engine, [(ids, out_len) for ids in reqs])
            runs.append(wall)
            cached.append(sum(o.usage.cached_tokens for o in outs))
            tokens = [list(o.token_ids) for o in outs]
            stats = await engine.stats()
            assert await engine.flush_cache()
        await engine.check_integrity()
    decisions = {
        k.removeprefix("router_decisions_"): v for k, v in stats.items() if k.startswith("router_decisions_")
    }
    return {
        "wall_s": min(runs),
        "runs_s": runs,
        "cached_tokens": cached[-1],
        "cached_runs": cached,
        "output_tok_s": len(reqs) * out_len / min(runs),
        "decisions": decisions,
        "tokens": tokens,
    }


async def w8(args: argparse.Namespace, vocab: int) -> list[dict[str, Any]]:
    reqs = w8_requests(args.groups, args.per_group, args.prefix, args.question, vocab)
    ideal = args.groups * (args.per_group - 1) * args.prefix
    devices = tuple(args.replica_devices.split(",")) if args.replica_devices else None
    dp = dict(data_parallel_size=args.replicas, data_parallel_devices=devices)
    configs = {
        "one engine": base_config(args),
        "cache-aware router": base_config(args, **dp),
        "round-robin": base_config(args, **dp, router=RouterConfig(policy="round_robin")),
    }
    res: dict[str, dict[str, Any]] = {}
    for name, cfg in configs.items():
        log(f"W8: {name}")
        res[name] = await w8_one(cfg, reqs, args.out_len, args.repeats)
    single, want = res["one engine"]["cached_tokens"], res["one engine"]["tokens"]
    rows, recs = [], []
    for name, r in res.items():
        same = sum(a == b for a, b in zip(r.pop("tokens"), want))
        fig = {
            **r,
            "of_ideal": r["cached_tokens"] / ideal,
            "of_one_engine": r["cached_tokens"] / max(1, single),
            "same_tokens_as_one_engine": same,
            "requests": len(reqs),
        }
        rows.append(
            [
                name,
                r["cached_tokens"],
                fig["of_ideal"],
                fig["of_one_engine"],
                r["output_tok_s"],
                r["wall_s"],
                same,
                " ".join(f"{k}={v}" for k, v in r["decisions"].items() if v),
            ]
        )
        recs.append(
            record(
                "W8",
                args.model,
                args.dtype,
                args.device,
                fig,
                setting=name,
                replicas=args.replicas,
                groups=args.groups,
                per_group=args.per_group,
                prefix=args.prefix,
                question=args.question,
                out_len=args.out_len,
                ideal_cached_tokens=ideal,
            )
        )
    shape = f"{args.groups} groups x {args.per_group}, {args.prefix}-token prefixes"
    print(f"\nW8: {shape}, {args.replicas} replicas")
    print_table(
        [
            "setting",
            "cached tokens",
            "/ ideal",
            "/ one engine",
            "out tok/s",
            "wall s",
            "same tokens",
            "decisions",
        ],
        rows,
    )
    return recs


async def w1(args: argparse.Namespace, vocab: int) -> list[dict[str, Any]]:
    reqs = w1_requests(args.w1_n, args.w1_lo, args.w1_hi, vocab)
    out_tokens = sum(n for _, n in reqs)
    kv = args.kv_cache_tokens or int(1.25 * sum(len(ids) + n for ids, n in reqs)) + 4096
    plain = AsyncEngine(base_config(args, kv_cache_tokens=kv))
    routed = AsyncEngine(base_config(args, kv_cache_tokens=kv, data_parallel_size=1))
    best: dict[tuple[str, str], list[float]] = {}
    async with plain, routed:
        for engine in (plain, routed):  # warm-up: kernels, allocator, graphs
            await offline(engine, reqs[:8])
            await engine.flush_cache()
        for r in range(args.repeats):
            order = (plain, routed) if r % 2 == 0 else (routed, plain)
            for engine in order:
                name = "plain engine" if engine is plain else "data_parallel_size=1"
                wall, _ = await offline(engine, reqs)
                await engine.flush_cache()
                best.setdefault((name, "complete()"), []).append(out_tokens / wall)
                wall, got = await streaming(engine, reqs)
                assert got == out_tokens, (got, out_tokens)
                await engine.flush_cache()
                best.setdefault((name, "streaming"), []).append(out_tokens / wall)
                log(f"W1 round {r}: {name} done")
    rows, recs = [], []
    for mode in ("complete()", "streaming"):
        a, b = max(best[("plain engine", mode)]), max(best[("data_parallel_size=1", mode)])
        rows.append([mode, a, b, b / a])
        fig = {
            "plain_tok_s": a,
            "replicated_tok_s": b,
            "ratio": b / a,
            "plain_runs": best[("plain engine", mode)],
            "replicated_runs": best[("data_parallel_size=1", mode)],
        }
        recs.append(
            record(
                "W1",
                args.model,
                args.dtype,
                args.device,
                fig,
                mode=mode,
                requests=len(reqs),
                lengths=[args.w1_lo, args.w1_hi],
                output_tokens=out_tokens,
            )
        )
    print(f"\nW1 ({len(reqs)} requests, lengths in [{args.w1_lo}, {args.w1_hi}]): the router's cost")
    print_table(["mode", "plain tok/s", "data_parallel_size=1 tok/s", "ratio"], rows)
    return recs


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu, cuda (replicas on cuda:0..N-1)")
    p.add_argument(
        "--model", default="smollm2-135m-instruct", help="embedded name, HF folder or dummy:<shape>"
    )
    p.add_argument("--load-format", default="auto", help="auto, or dummy (random weights of a named shape)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--only", choices=["w8", "w1"], default=None)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--replicas", type=int, default=3, help="replicas of the W8 runs")
    p.add_argument("--replica-devices", default=None, help="comma-separated, e.g. cuda:0,cuda:0 (one GPU)")
    p.add_argument(
        "--kv-cache-tokens", type=int, default=None, help="KV pool per engine (default: the device's)"
    )
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--per-group", type=int, default=6)
    p.add_argument("--prefix", type=int, default=200)
    p.add_argument("--question", type=int, default=32)
    p.add_argument("--out-len", type=int, default=16)
    p.add_argument("--w1-n", type=int, default=None, help="default: 256 on a GPU, 16 on the CPU (W1-cpu)")
    p.add_argument("--w1-lo", type=int, default=None)
    p.add_argument("--w1-hi", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.w1_n = args.w1_n or (256 if gpu else 16)
    args.w1_lo = args.w1_lo or (100 if gpu else 16)
    args.w1_hi = args.w1_hi or (1024 if gpu else 128)
    if not gpu and args.kv_cache_tokens is None:
        args.kv_cache_tokens = 16384  # each replica's pool: several fit in the CPU's memory
    if args.quick:
        args = replace_ns(
            args,
            groups=2,
            per_group=3,
            prefix=48,
            question=8,
            out_len=4,
            repeats=1,
            w1_n=4,
            w1_lo=8,
            w1_hi=16,
            replicas=min(args.replicas, 3),
        )
    args.out = args.out or str(
        Path(__file__).resolve().parent / "results" / f"replicas_{args.device.split(':')[0]}.json"
    )
    return args


def replace_ns(ns: argparse.Namespace, **kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(ns), **kw})


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    vocab = await vocab_of(args)
    recs: list[dict[str, Any]] = []
    if args.only in (None, "w8"):
        recs += await w8(args, vocab)
    if args.only in (None, "w1"):
        recs += await w1(args, vocab)
    return recs


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    env = environment()
    recs = asyncio.run(run(args))
    path = write_results(args.out, recs, env, quick=args.quick)
    log(f"wrote {path}")
    return recs


if __name__ == "__main__":
    main()
