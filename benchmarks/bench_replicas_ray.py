"""W8 on Ray Serve: the prefix-affinity request router against Ray Serve's default router.

    python benchmarks/bench_replicas_ray.py                 # CPU: 2 replicas, W8 4x6 (200-token prefixes)
    python benchmarks/bench_replicas_ray.py --quick         # a smoke run
    python benchmarks/bench_replicas_ray.py --device cuda --model dummy:llama-3.1-8b --load-format dummy \\
        --replicas 8 --groups 64 --per-group 16 --prefix 2048

`radixserve.ray.build_app` on a local Ray (needs the `ray` extra), once with
`prefix_router=True` and once with Ray Serve's default router (power of two
choices), each a fresh application warmed up by an unrelated request. W8's
requests (BENCHMARKS.md; `common.w8_requests`) go through Ray Serve's HTTP
proxy and the ingress as OpenAI completions with token-id prompts, all at
once; `--out-len` tokens each, greedy, EOS ignored. Figures: cached prompt
tokens (`usage.prompt_tokens_details.cached_tokens`) against the ideal
G·(R−1)·P, and output tok/s. Prints a table; writes JSON (default
benchmarks/results/replicas_ray_<device>.json).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, environment, print_table, record, w8_requests, write_results  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_replicas_ray] {msg}", file=sys.stderr, flush=True)


async def run_w8(url: str, model: str, reqs: list[list[int]], out_len: int) -> tuple[float, int]:
    import httpx

    body: dict[str, Any] = {"model": model, "max_tokens": out_len, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await http.post("/v1/completions", json={**body, "prompt": [1, 2, 3], "max_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        got = await asyncio.gather(
            *(http.post("/v1/completions", json={**body, "prompt": ids}) for ids in reqs)
        )
        wall = time.perf_counter() - t0
    for r in got:
        r.raise_for_status()
    return wall, sum(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in got)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    env = environment()
    import ray
    from ray import serve

    from radixserve import EngineConfig
    from radixserve.ray import build_app

    ray.init(
        num_cpus=max(8, args.replicas + 2),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    cfg = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        load_format=args.load_format,
        kv_cache_tokens=args.kv_cache_tokens,
    )
    reqs = w8_requests(args.groups, args.per_group, args.prefix, args.question, args.vocab)
    ideal = args.groups * (args.per_group - 1) * args.prefix
    rows, recs = [], []
    try:
        for name, prefix_router in (("prefix-affinity router", True), ("Ray's default router", False)):
            log(f"W8: {name}")
            serve.run(build_app(cfg, args.replicas, prefix_router=prefix_router), name="w8", route_prefix="/")
            wall, cached = asyncio.run(run_w8(url, args.model, reqs, args.out_len))
            serve.delete("w8")
            fig = {
                "cached_tokens": cached,
                "of_ideal": cached / ideal,
                "wall_s": wall,
                "output_tok_s": len(reqs) * args.out_len / wall,
                "requests": len(reqs),
            }
            rows.append([name, cached, fig["of_ideal"], fig["output_tok_s"], wall])
            recs.append(
                record(
                    "W8-ray",
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
    finally:
        serve.shutdown()
        ray.shutdown()
    shape = f"{args.groups} groups x {args.per_group}, {args.prefix}-token prefixes"
    print(f"\nW8 on Ray Serve: {shape}, {args.replicas} replicas")
    print_table(["router", "cached tokens", "/ ideal", "out tok/s", "wall s"], rows)
    log(f"wrote {write_results(args.out, recs, env, quick=args.quick)}")
    return recs


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--kv-cache-tokens", type=int, default=None)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--per-group", type=int, default=6)
    p.add_argument("--prefix", type=int, default=200)
    p.add_argument("--question", type=int, default=32)
    p.add_argument("--out-len", type=int, default=16)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.device == "cpu" and args.kv_cache_tokens is None:
        args.kv_cache_tokens = 16384
    if args.quick:
        args.groups, args.per_group, args.prefix, args.question, args.out_len = 2, 3, 48, 8, 4
    args.out = args.out or str(
        ROOT / "benchmarks" / "results" / f"replicas_ray_{args.device.split(':')[0]}.json"
    )
    return args


if __name__ == "__main__":
    main()
