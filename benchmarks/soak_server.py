"""Soak the HTTP server: many requests of mixed kinds, random disconnects and invalid bodies.

    python benchmarks/soak_server.py --requests 1000 --concurrency 32     # full size
    python benchmarks/soak_server.py --requests 2000 --concurrency 32     # with the hostile kinds
    python benchmarks/soak_server.py --requests 80                        # the size CI runs (tests/server)

Starts a server on 127.0.0.1 (uvicorn in a thread, the embedded model on the
CPU unless --device says otherwise) and sends a seeded mix: plain and streamed
chat, completions with n > 1, clients that hang up mid-stream or time out
while waiting, malformed JSON, out-of-range parameters, unknown roles,
oversized bodies and wrong API keys, and hostile but well-formed input: recursive,
slow-to-compile, huge-enum, lookaround and deeply nested JSON schemas, bodies nested
10,000 deep, prompts far over the context. Every answer is checked (status code,
OpenAI error body, streams ending in [DONE], n choices); afterwards nothing
may run, every KV slot is accounted for (`check_integrity()`) and the server
still answers. Prints a table and writes JSON under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"
KINDS = [  # (kind, weight)
    ("chat", 20),
    ("chat_stream", 20),
    ("completion_n", 10),
    ("stream_n", 8),
    ("disconnect_stream", 10),
    ("vanish_waiting", 4),
    ("bad_json", 6),
    ("bad_param", 6),
    ("bad_role", 5),
    ("oversized", 4),
    ("bad_key", 4),
    ("logprobs", 3),
    # Hostile but well-formed input: each must get an answer or a clear 4xx, never a hang.
    ("recursive_schema", 3),
    ("slow_schema", 1),
    ("big_enum", 1),
    ("lookaround_pattern", 2),
    ("deep_schema", 2),
    ("deep_body", 3),
    ("huge_prompt", 3),
]
RECURSIVE = {  # a schema no finite JSON satisfies: jump-forward once looped on it forever
    "$ref": "#/$defs/n",
    "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
}
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "garden",
    "engine",
    "lantern",
    "violet",
    "harbor",
    "meadow",
    "copper",
    "winter",
]


HOSTILE = {
    "recursive_schema",
    "slow_schema",
    "big_enum",
    "lookaround_pattern",
    "deep_schema",
    "deep_body",
    "huge_prompt",
}


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24)))


def _chat(rng: random.Random, **kw: Any) -> dict[str, Any]:
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    return {
        "model": MODEL,
        "messages": [system, {"role": "user", "content": _prompt(rng)}],
        "max_tokens": rng.randint(1, 8),
        **kw,
    }


def _is_error(r: httpx.Response, status: int) -> bool:
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return r.status_code == status and isinstance(err.get("message"), str) and "type" in err


def _schema_chat(rng: random.Random, schema: Any) -> dict[str, Any]:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return _chat(rng, response_format=fmt, temperature=0, max_tokens=rng.randint(4, 24))


def _answered_or_refused(r: httpx.Response) -> bool:
    """A hostile schema may decode (200, bounded by max_tokens) or fail its request (a 400)."""
    if r.status_code == 200:
        return r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    return _is_error(r, 400)


def _resident_mb() -> float:
    """This process's resident memory (the server runs in it, in a thread)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _nested(depth: int, inner: str) -> str:
    return "[" * depth + inner + "]" * depth


def _hostile_schema(kind: str, rng: random.Random) -> Any:
    if kind == "recursive_schema":
        return RECURSIVE
    if kind == "slow_schema":  # many properties: compile time grows faster than linearly
        props = {f"p{i}_{rng.randint(0, 10**6)}": {"type": "string"} for i in range(rng.randint(200, 500))}
        return {"type": "object", "properties": props, "required": list(props)[:3]}
    if kind == "big_enum":
        return {"enum": [f"v{rng.randint(0, 10**9)}_{i}" for i in range(4000)]}
    if kind == "lookaround_pattern":
        pattern = rng.choice(["^(?=.*[0-9])[a-z0-9]+$", "^(?!x)[a-z]+$", "^(a)\\1$"])
        return {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    schema: Any = {"type": "string"}  # deep_schema
    for _ in range(rng.choice([140, 480, 600])):  # past the schema depth limit, then the body's
        schema = {"type": "array", "items": schema}
    return schema


async def _hostile(client: httpx.AsyncClient, kind: str, rng: random.Random) -> bool:
    if kind == "deep_body":  # JSON nested 10,000 deep, on generation routes and an admin route
        path = rng.choice(["/generate", "/abort_request", "/v1/chat/completions"])
        raw = ('{"text": "hi", "sampling_params": ' + _nested(10_000, "1") + "}").encode()
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
        return r.status_code == 400 and "traceback" not in r.text.lower()
    if kind == "huge_prompt":  # under the body limit, ~31k tokens: refused before the model
        body = {"model": MODEL, "prompt": "7 " * 31_000, "max_tokens": 4}
        return _is_error(await client.post("/v1/completions", json=body), 400)
    r = await client.post("/v1/chat/completions", json=_schema_chat(rng, _hostile_schema(kind, rng)))
    if kind in ("lookaround_pattern", "deep_schema"):  # never silently ignored, never a 500
        return _is_error(r, 400)
    return _answered_or_refused(r)


async def _events(r: httpx.Response) -> list[Any]:
    out: list[Any] = []
    async for line in r.aiter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


async def one(client: httpx.AsyncClient, kind: str, rng: random.Random, max_body: int) -> bool:
    """Send one request of `kind`; True when the answer is what that kind must get."""
    if kind == "chat":
        r = await client.post("/v1/chat/completions", json=_chat(rng, temperature=rng.choice([0, 0.7])))
        return r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    if kind == "logprobs":
        r = await client.post("/v1/chat/completions", json=_chat(rng, logprobs=True, top_logprobs=2))
        return r.status_code == 200 and r.json()["choices"][0]["logprobs"]["content"] is not None
    if kind in ("chat_stream", "stream_n"):
        n = 1 if kind == "chat_stream" else rng.randint(2, 3)
        body = _chat(rng, stream=True, n=n, stream_options={"include_usage": True})
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return False
            ev = await _events(r)
        finished = {c["index"] for e in ev[:-1] for c in e.get("choices", []) if c["finish_reason"]}
        return ev[-1] == "[DONE]" and finished == set(range(n)) and ev[-2]["usage"]["completion_tokens"] > 0
    if kind == "completion_n":
        n = rng.randint(2, 4)
        body = {
            "model": MODEL,
            "prompt": _prompt(rng),
            "max_tokens": rng.randint(1, 6),
            "n": n,
            "seed": rng.randint(0, 99),
        }
        r = await client.post("/v1/completions", json=body)
        return r.status_code == 200 and sorted(c["index"] for c in r.json()["choices"]) == list(range(n))
    if kind == "disconnect_stream":
        body = {"model": MODEL, "prompt": _prompt(rng), "max_tokens": 200, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= rng.randint(1, 3):
                    break  # leaving the block closes the connection mid-stream
        return r.status_code == 200
    if kind == "vanish_waiting":
        body = {"model": MODEL, "prompt": _prompt(rng), "max_tokens": 200}
        try:
            await client.post("/v1/completions", json=body, timeout=rng.uniform(0.05, 0.3))
        except httpx.TimeoutException:
            return True
        return True  # it finished before the client gave up: also fine
    if kind == "bad_json":
        raw = rng.choice([b'{"model": ', b"[1, 2", b"not json", b'{"messages": [}'])
        r = await client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        return _is_error(r, 400)
    if kind == "bad_param":
        change = rng.choice(
            [{"temperature": -1}, {"top_p": 2}, {"n": 0}, {"max_tokens": -3}, {"logit_bias": {"x": 1}}]
        )
        r = await client.post("/v1/chat/completions", json={**_chat(rng), **change})
        return _is_error(r, 400)
    if kind == "bad_role":
        body = {**_chat(rng), "messages": [{"role": rng.choice(["wizard", "", "USER"]), "content": "hi"}]}
        r = await client.post("/v1/chat/completions", json=body)
        return _is_error(r, 400)
    if kind == "oversized":
        body = {**_chat(rng), "messages": [{"role": "user", "content": "x" * (max_body + 1)}]}
        r = await client.post("/v1/chat/completions", json=body)
        return _is_error(r, 413)
    if kind in HOSTILE:
        return await _hostile(client, kind, rng)
    if kind == "bad_key":
        r = await client.post(
            "/v1/chat/completions", json=_chat(rng), headers={"authorization": "Bearer nope"}
        )
        return _is_error(r, 401)
    raise ValueError(kind)


async def soak(
    url: str, api_key: str, requests: int, concurrency: int, max_body: int, seed: int = 0
) -> dict[str, Any]:
    rng = random.Random(seed)
    names, weights = zip(*KINDS)
    # One of every kind first (so a short run sends each), then the seeded mix.
    kinds = list(names)[:requests] + rng.choices(names, weights, k=max(0, requests - len(names)))
    plan = [(k, random.Random(rng.random())) for k in kinds]
    ok: collections.Counter[str] = collections.Counter()
    bad: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    sem = asyncio.Semaphore(concurrency)
    headers = {"authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:

        async def run(kind: str, r: random.Random) -> None:
            async with sem:
                try:
                    good = await one(client, kind, r, max_body)
                except Exception as e:
                    good = False
                    errors.append(f"{kind}: {type(e).__name__}: {e}")
                (ok if good else bad)[kind] += 1

        resident = [_resident_mb()]
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), 2.0)
                resident.append(_resident_mb())

        sampler = asyncio.ensure_future(sample())
        t0 = time.perf_counter()
        await asyncio.gather(*(run(k, r) for k, r in plan))
        seconds = time.perf_counter() - t0
        done.set()
        await sampler
        final = await client.post("/v1/chat/completions", json=_chat(rng))
    return {
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(seconds, 2),
        "requests_per_s": round(requests / seconds, 2),
        "ok": dict(ok),
        "failed": dict(bad),
        "errors": errors[:20],
        "still_serving": final.status_code == 200,
        # Resident memory (MB) of the process serving: at the start, at its peak, at the end,
        # and at the end of the first and last quarter of the run (growth between those two).
        "resident_mb": {
            "start": round(resident[0], 1),
            "peak": round(max(resident), 1),
            "end": round(resident[-1], 1),
            "quarter": round(resident[len(resident) // 4], 1),
            "half": round(resident[len(resident) // 2], 1),
            "three_quarters": round(resident[3 * len(resident) // 4], 1),
        },
    }


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import environment, print_table, write_results

    from radixserve import AsyncEngine, EngineConfig
    from radixserve.server import ServerLimits
    from radixserve.server.runner import ServerThread

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "soak_server.json"))
    args = ap.parse_args()
    env = environment()
    limits = ServerLimits(max_body_bytes=256 * 1024)  # room for the 4,000-value enums
    engine = AsyncEngine(EngineConfig(model=MODEL, device=args.device))
    with ServerThread(engine, api_key="soak", limits=limits) as server:
        report = asyncio.run(
            soak(server.url, "soak", args.requests, args.concurrency, limits.max_body_bytes, args.seed)
        )

        async def settle() -> dict[str, Any]:
            for _ in range(600):
                s = await engine.stats()
                if s["running"] == s["waiting"] == 0:
                    break
                await asyncio.sleep(0.05)
            await engine.check_integrity()
            cache = engine.grammar_cache
            grammars = {"grammars": len(cache), "grammar_mb": round(cache.bytes / 2**20, 1)} if cache else {}
            return {**s, "gate_in_flight": server.app.state.gate.in_flight, **grammars}

        report["after"] = server.call(settle)
    rows = [(k, report["ok"].get(k, 0), report["failed"].get(k, 0)) for k, _ in KINDS]
    print_table(["kind", "ok", "failed"], rows)
    print(
        f"{args.requests} requests in {report['seconds']} s ({report['requests_per_s']} req/s), "
        f"still serving: {report['still_serving']}, after: {report['after']}, "
        f"resident MB: {report['resident_mb']}"
    )
    write_results(args.out, [report], env)
    return 0 if not report["failed"] and report["still_serving"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
