"""Hostile input and faults over HTTP: right status and OpenAI error body, nothing leaked, still serving."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from radixserve.server import ServerLimits, create_app
from radixserve.server.runner import ServerThread

from .conftest import API_KEY, LIMITS, MODEL, settled

AUTH = {"authorization": f"Bearer {API_KEY}"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
LONG = {
    "model": MODEL,
    "prompt": "Count from one to one thousand: one, two,",
    "max_tokens": 600,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def http(live: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, headers=AUTH, timeout=60) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err  # type: ignore[no-any-return]


def test_api_key(live: ServerThread, http: httpx.Client) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as anon:
        err = error_of(anon.post("/v1/chat/completions", json=CHAT), 401)
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert error_of(anon.get("/v1/models", headers={"authorization": "Bearer wrong"}), 401)["code"]
        assert anon.get("/metrics").status_code == 401
        assert anon.get("/v1/models", headers={"authorization": "Basic " + API_KEY}).status_code == 401
    assert http.get("/v1/models").status_code == 200


def test_body_limits_and_malformed_json(http: httpx.Client) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (LIMITS.max_body_bytes + 10)}]}
    err = error_of(http.post("/v1/chat/completions", json=big), 413)
    assert str(LIMITS.max_body_bytes) in err["message"]

    def chunks() -> Iterator[bytes]:  # no content-length: the limit counts the bytes as they come
        for _ in range(LIMITS.max_body_bytes // 4096 + 2):
            yield b" " * 4096

    error_of(
        http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"}), 413
    )
    bad = http.post(
        "/v1/chat/completions", content=b'{"model": "x", ', headers={"content-type": "application/json"}
    )
    assert "JSON" in error_of(bad, 400)["message"]
    assert error_of(http.post("/v1/chat/completions", json=[1, 2]), 400)["type"] == "invalid_request_error"
    assert error_of(http.post("/v1/chat/completions", json={"model": MODEL}), 400)["param"] == "messages"


@pytest.mark.parametrize(
    "messages, param",
    [
        ([], "messages"),
        ([{"role": "wizard", "content": "hi"}], "messages.0"),
        ([{"content": "hi"}], "messages.0"),
        ([{"role": "user", "content": 42}], "messages.0"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content",
        ),
        ("hello", "messages"),
    ],
)
def test_malformed_chat_messages(http: httpx.Client, messages: Any, param: str) -> None:
    err = error_of(http.post("/v1/chat/completions", json={**CHAT, "messages": messages}), 400)
    assert err["param"].startswith(param), err


@pytest.mark.parametrize(
    "change, status, param",
    [
        ({"temperature": -1}, 400, "temperature"),
        ({"top_p": 0}, 400, "top_p"),
        ({"n": 10_000}, 400, "n"),
        ({"max_tokens": -5}, 400, "max_tokens"),
        ({"logit_bias": {"abc": 1}}, 400, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, 400, "logit_bias"),
        ({"top_logprobs": 3}, 400, "top_logprobs"),
        ({"model": "gpt-4o"}, 404, "model"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, 400, "tools"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "messages"),
    ],
)
def test_bad_parameters(http: httpx.Client, change: dict[str, Any], status: int, param: str) -> None:
    err = error_of(http.post("/v1/chat/completions", json={**CHAT, **change}), status)
    assert err["param"] == param, err


def test_bad_completion_prompts(http: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 2}
    assert error_of(http.post("/v1/completions", json={**body, "prompt": [10**9]}), 400)["message"]
    assert error_of(http.post("/v1/completions", json={**body, "prompt": []}), 400)["param"] == "prompt"
    assert (
        error_of(http.post("/v1/completions", json={**body, "prompt": "a", "echo": True}), 400)["param"]
        == "echo"
    )
    assert error_of(http.post("/v1/completions", json={**body, "prompt": [[1, 2, 3], "text"]}), 400)
    r = http.post("/v1/completions", json={**body, "prompt": [[1, 2, 3], [4, 5, 6]]})
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1]


def test_vanishing_streaming_client(live: ServerThread, http: httpx.Client) -> None:
    """A client that reads the first events and hangs up: its request is aborted, its KV freed."""
    for _ in range(3):
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
    stats = settled(live)  # fails unless the aborts land well before 600 tokens are generated
    assert stats["running"] == 0
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_vanishing_client_while_waiting_for_json(live: ServerThread) -> None:
    with (
        httpx.Client(base_url=live.url, headers=AUTH, timeout=1.5) as impatient,
        pytest.raises(httpx.TimeoutException),
    ):
        impatient.post("/v1/completions", json=LONG)
    settled(live)


def test_slow_reader_gets_everything(live: ServerThread, http: httpx.Client) -> None:
    import time

    body = {**CHAT, "max_tokens": 10, "temperature": 0, "stream": True}
    text = ""
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            time.sleep(0.05)
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text += c["delta"].get("content", "")
    plain = http.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert text == plain["choices"][0]["message"]["content"]


def test_full_queue_answers_503_then_recovers(live: ServerThread) -> None:
    """A second app over the same engine with room for 2 completions: the third waits for nobody."""

    async def scenario() -> list[int]:
        app = create_app(live.engine, limits=ServerLimits(max_queued_requests=2))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60) as c:
            long = asyncio.ensure_future(c.post("/v1/completions", json={**LONG, "max_tokens": 40, "n": 2}))
            while app.state.gate.in_flight < 2:
                await asyncio.sleep(0.01)
            full = await c.post("/v1/chat/completions", json=CHAT)
            stream_full = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
            assert full.json()["error"]["code"] == "server_overloaded"
            done = await long
            after = await c.post("/v1/chat/completions", json=CHAT)
            assert app.state.gate.in_flight == 0
            return [full.status_code, stream_full.status_code, done.status_code, after.status_code]

    assert live.call(scenario) == [503, 503, 200, 200]
    settled(live)


def test_metrics(live: ServerThread, http: httpx.Client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for stream in (False, True):
        assert http.post("/v1/chat/completions", json={**CHAT, "stream": stream}).status_code == 200
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {
        s.name + json.dumps(s.labels, sort_keys=True): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }
    assert samples["radixserve_prompt_tokens_total{}"] > 0
    assert samples["radixserve_generation_tokens_total{}"] > 0
    assert samples["radixserve_time_to_first_token_seconds_count{}"] >= 2
    assert samples["radixserve_inter_token_latency_seconds_count{}"] > 0
    assert samples["radixserve_e2e_request_latency_seconds_count{}"] >= 2
    assert samples['radixserve_requests_total{"finish_reason": "length"}'] >= 1
    assert samples["radixserve_num_requests_running{}"] == 0
    assert 0 < samples["radixserve_kv_cache_usage_ratio{}"] <= 1  # the radix cache holds earlier prompts
    assert 0 < samples["radixserve_cache_hit_rate{}"] < 1
    # A second app in the same process has its own registry: nothing collides, nothing is shared.
    other = create_app(live.engine)
    assert other.state.metrics.registry is not live.app.state.metrics.registry


def test_engine_not_running_is_503() -> None:
    """An app over an engine that was never started (or has stopped): 503, OpenAI's shape."""
    from radixserve import AsyncEngine, EngineConfig

    async def scenario() -> tuple[int, dict[str, Any]]:
        app = create_app(AsyncEngine(EngineConfig(model=MODEL)), api_key="k")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers={"authorization": "Bearer k"}
        ) as c:
            r = await c.post("/v1/chat/completions", json=CHAT)
            return r.status_code, r.json()

    status, body = asyncio.run(scenario())
    assert status == 503 and body["error"]["code"] == "engine_unavailable"
