"""radixserve on Ray Serve: a local Ray, 2 replicas of the embedded model on the CPU.

The real `openai` client gets answers through Ray Serve's HTTP proxy and the ingress
(`create_app`'s routes); on a shared-prefix workload (W8's shape, small: one request of
each group, then the rest at once) the prefix-affinity request router serves more cached
prompt tokens than Ray Serve's default router (power of two choices), both printed
(`pytest -s`). CI installs the `ray` extra for it.
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from ray import serve

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

MODEL = "smollm2-135m-instruct"
GROUPS, PER_GROUP, PREFIX, QUESTION = 3, 6, 160, 8
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_serve() -> Iterator[str]:
    """A local Ray (replicas import radixserve from this checkout) and Serve's HTTP proxy."""
    import ray

    ray.init(
        num_cpus=8,  # logical: an ingress and two replicas, each one CPU, on any machine
        include_dashboard=False,
        object_store_memory=256 << 20,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        log_to_driver=False,
    )
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _workload(vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(0)
    prefixes = [[rng.randint(0, vocab - 1) for _ in range(PREFIX)] for _ in range(GROUPS)]
    return [
        prefixes[g] + [rng.randint(0, vocab - 1) for _ in range(QUESTION)]
        for _ in range(PER_GROUP)
        for g in range(GROUPS)
    ]


def _cached_tokens(client: Any, requests: list[list[int]]) -> int:
    """Cached prompt tokens over the workload: one request of each group first (its prefix then
    cached on the replica it reached), then the rest at once. Sent all at once from the start, a
    group's first requests race each other to the cache on any router, and with 12 requests
    over 2 replicas Ray's default router once matched the prefix router's count by chance; now
    it would have to send each of 15 requests where its group's prefix is."""

    def one(ids: list[int]) -> int:
        out = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0)
        return int(out.usage.prompt_tokens_details.cached_tokens)

    with ThreadPoolExecutor(len(requests)) as pool:
        first = sum(pool.map(one, requests[:GROUPS]))  # the workload's first GROUPS: one per group
        return first + sum(pool.map(one, requests[GROUPS:]))


def _abort_flush_and_metrics(url: str) -> None:
    """The native routes that reach every replica: abort (wherever the request runs),
    flush_cache and /metrics (every replica's stats, summed)."""
    import httpx

    greedy = {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True}
    req = {"text": "Count to a thousand:", "rid": "abort-me", "sampling_params": greedy, "stream": True}
    events: list[str] = []
    with httpx.Client(base_url=url, timeout=120) as http:
        with http.stream("POST", "/generate", json=req) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
                    if len(events) == 1:
                        assert http.post("/abort_request", json={"rid": "abort-me"}).status_code == 200
        last = json.loads(events[-2])
        assert last["meta_info"]["finish_reason"]["type"] == "abort" and len(last["output_ids"]) < 2000
        assert http.post("/flush_cache").status_code == 200
        metrics = http.get("/metrics").text
    assert "radixserve_num_requests_running" in metrics and "radixserve_kv_cache_usage_ratio" in metrics


def test_openai_client_through_ray_serve_and_the_prefix_router(ray_serve: str) -> None:
    from radixserve import EngineConfig
    from radixserve.ray import build_app

    cfg = EngineConfig(model=MODEL, device="cpu", dtype="float32", kv_cache_tokens=4096)
    client = openai.OpenAI(base_url=f"{ray_serve}/v1", api_key="unused", max_retries=0, timeout=120)
    requests = _workload()
    cached: dict[str, int] = {}
    for name, prefix_router in (("prefix-affinity router", True), ("Ray's default router", False)):
        serve.run(build_app(cfg, 2, prefix_router=prefix_router), name="radixserve", route_prefix="/")
        if prefix_router:
            chat = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=8
            )
            assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
            streamed = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Name a color."}],
                max_tokens=6,
                stream=True,
            )
            assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
            _abort_flush_and_metrics(ray_serve)
        cached[name] = _cached_tokens(client, requests)
        serve.delete("radixserve")
    ideal = GROUPS * (PER_GROUP - 1) * PREFIX
    print(f"\nW8 on Ray Serve (2 replicas, {GROUPS} groups x {PER_GROUP}, {PREFIX}-token prefixes)")
    for name, n in cached.items():
        print(f"{name:<24} cached prompt tokens {n:>6}  ({n / ideal:.3f} of the ideal {ideal})")
    assert cached["prefix-affinity router"] > cached["Ray's default router"]


def test_radixserve_serve_ray_as_a_user_starts_it() -> None:
    """`radixserve serve --ray --replicas 2`: its own local Ray, answers, stops on Ctrl-C."""
    import signal

    import httpx
    from server.conftest import start_serve

    proc, url = start_serve("k", "--ray", "--replicas", "2")
    try:
        assert proc.stderr is not None
        body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        headers = {"authorization": "Bearer k"}
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 401
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(120) == 0, rest
        assert "radixserve: stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_ingress_engine_is_an_asyncengine_over_the_replicas_handle() -> None:
    """The ingress serves an `AsyncEngine` whose core is `ServeReplicas`: the API is the one
    engine's, with nothing of one engine's parts, and it takes no request before `start()`."""
    import asyncio

    from radixserve.config import EngineConfig
    from radixserve.engine import AsyncEngine
    from radixserve.ray.ingress import ServeReplicas

    config = EngineConfig(model=MODEL)
    engine = AsyncEngine.over(ServeReplicas(config, replicas=None))  # no handle: never started
    assert engine.config is config and engine.replicas == ()
    assert engine.scheduler is None and engine.pool is None and engine.loaded is None
    assert not engine.healthy and engine.grammar_cache is None
    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(engine.complete("Hello"))
