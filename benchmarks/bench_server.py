"""HTTP serving under load: 256 concurrent streaming clients on 127.0.0.1 against `AsyncEngine` directly.

    python benchmarks/bench_server.py                         # CPU, the embedded model
    python benchmarks/bench_server.py --device cuda --model dummy:llama-3.1-8b --max-tokens 128

One run, one engine: the server (uvicorn in a thread of this process, the
engine in its loop) and, interleaved round by round, the same requests as
in-process `engine.generate()` streams. The HTTP clients run in a child
process (`--client`, httpx streaming `/v1/completions`), so they do not share
the server's interpreter. Every request ignores EOS and must stream exactly
`--max-tokens` tokens and end with `[DONE]`: a lost, cut or failed stream fails
the run. Prints a table (tokens/s, the HTTP/direct ratio, client-side TTFT)
and writes JSON under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent


def workload(n: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """n prompts of random token ids (lengths uniform in [lo, hi]), the same for both modes."""
    rng = random.Random(seed)
    lengths = [rng.randint(lo, hi) for _ in range(n)]
    return [[rng.randint(0, vocab - 1) for _ in range(k)] for k in lengths]


def _summary(
    mode: str, seconds: float, tokens: list[int], ttft: list[float], expected: int
) -> dict[str, Any]:
    q = statistics.quantiles(ttft, n=100) if len(ttft) > 1 else ttft * 99
    return {
        "mode": mode,
        "requests": len(tokens),
        "complete": sum(t == expected for t in tokens),
        "tokens": sum(tokens),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(sum(tokens) / seconds, 1),
        "ttft_p50_s": round(q[49], 3),
        "ttft_p99_s": round(q[98], 3),
    }


# ---- the client process -------------------------------------------------------------------------


async def http_round(url: str, model: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(ids: list[int]) -> tuple[int, float]:
            body = {
                "model": model,
                "prompt": ids,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            t0 = time.perf_counter()
            ttft, tokens, done = 0.0, 0, False
            async with client.stream("POST", "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise RuntimeError(event["error"]["message"])
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                    elif not ttft:
                        ttft = time.perf_counter() - t0
            return (tokens if done else -1), ttft

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts), return_exceptions=True)
        seconds = time.perf_counter() - t0
    ok = [r for r in results if isinstance(r, tuple)]
    errors = [repr(r) for r in results if not isinstance(r, tuple)]
    tokens = [t for t, _ in ok] + [-1] * len(errors)
    return {
        **_summary("http", seconds, tokens, [f for _, f in ok] or [0.0], max_tokens),
        "errors": errors[:5],
    }


def client_main(args: argparse.Namespace) -> int:
    spec = json.loads(sys.stdin.read())
    res = asyncio.run(http_round(args.client, spec["model"], spec["prompts"], spec["max_tokens"]))
    print(json.dumps(res))
    return 0


# ---- the server process -------------------------------------------------------------------------


async def direct_round(engine: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from radixserve import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def one(ids: list[int]) -> tuple[int, float]:
        t0 = time.perf_counter()
        ttft, final = 0.0, None
        async for out in engine.generate(ids, params):
            if not ttft and out.delta_token_ids:
                ttft = time.perf_counter() - t0
            final = out
        assert final is not None and final.finished
        return len(final.token_ids), ttft

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    seconds = time.perf_counter() - t0
    return _summary("direct", seconds, [t for t, _ in results], [f for _, f in results], max_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)  # internal: run the HTTP clients
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64))
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best of, per mode)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.client:
        return client_main(args)

    sys.path.insert(0, str(HERE))
    from common import environment, print_table, write_results

    from radixserve import AsyncEngine, EngineConfig
    from radixserve.server.runner import ServerThread

    env = environment()
    engine = AsyncEngine(EngineConfig(model=args.model, device=args.device))
    rows: list[dict[str, Any]] = []
    with ServerThread(engine) as server:
        assert engine.loaded is not None
        vocab = engine.loaded.config.vocab_size
        warm = workload(8, vocab, *args.prompt_len, seed=99)
        server.call(lambda: direct_round(engine, warm, 4))
        for r in range(args.rounds):
            prompts = workload(args.clients, vocab, *args.prompt_len, seed=r)  # new prompts: no cache hits
            rows.append(
                {"round": r, **server.call(lambda p=prompts: direct_round(engine, p, args.max_tokens), 1800)}
            )
            server.call(engine.flush_cache)
            prompts = workload(args.clients, vocab, *args.prompt_len, seed=1000 + r)
            spec = json.dumps(
                {"model": engine.config.model, "prompts": prompts, "max_tokens": args.max_tokens}
            )
            child = subprocess.run(
                [sys.executable, __file__, "--client", server.url],
                input=spec,
                capture_output=True,
                text=True,
                timeout=1800,
                check=True,
            )
            rows.append({"round": r, **json.loads(child.stdout)})
            server.call(engine.flush_cache)

        async def after() -> dict[str, Any]:
            await engine.check_integrity()
            return await engine.stats()

        stats = server.call(after)
        in_flight = server.app.state.gate.in_flight
    best = {
        m: max((x for x in rows if x["mode"] == m), key=lambda x: x["tokens_per_s"])
        for m in ("direct", "http")
    }
    ratio = best["http"]["tokens_per_s"] / best["direct"]["tokens_per_s"]
    headers = [
        "round",
        "mode",
        "requests",
        "complete",
        "tokens",
        "seconds",
        "tokens/s",
        "ttft p50",
        "ttft p99",
    ]
    print_table(
        headers,
        [
            [
                x["round"],
                x["mode"],
                x["requests"],
                x["complete"],
                x["tokens"],
                x["seconds"],
                x["tokens_per_s"],
                x["ttft_p50_s"],
                x["ttft_p99_s"],
            ]
            for x in rows
        ],
    )
    lost = sum(x["requests"] - x["complete"] for x in rows)
    print(
        f"HTTP / direct tokens/s (best rounds): {ratio:.3f}; lost or cut streams: {lost}; "
        f"after: running={stats['running']} waiting={stats['waiting']} gate={in_flight}"
    )
    device = str(engine.config.torch_device()) if hasattr(engine.config, "torch_device") else args.device
    out = args.out or str(HERE / "results" / f"server_{device.split(':')[0]}.json")
    write_results(
        out,
        rows,
        env,
        model=args.model,
        device=device,
        clients=args.clients,
        max_tokens=args.max_tokens,
        http_over_direct=round(ratio, 4),
        lost=lost,
    )
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
