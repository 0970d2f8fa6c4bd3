"""The examples run: the quickstart, the shared-system-prompt batch, and the FastAPI SSE app.

fastapi and httpx are dev requirements: without them these tests fail (ImportError), never skip.
"""

from __future__ import annotations

import asyncio
import json
from types import ModuleType
from typing import Any

import httpx
import pytest
from script_loader import load_example

from radixserve import EngineConfig, SamplingParams


def test_async_quickstart_streams_then_completes(capsys: pytest.CaptureFixture[str]) -> None:
    final = asyncio.run(load_example("async_quickstart").main(max_tokens=6, device="cpu"))
    lines = capsys.readouterr().out.splitlines()
    assert final.finished and final.finish_reason in ("stop", "length")
    assert lines[-1] == f"cached_tokens={final.usage.cached_tokens} finish_reason={final.finish_reason}"
    assert final.usage.cached_tokens > 0  # the chat template's prefix, computed by the first request
    assert final.text.strip() and final.text.strip() in "\n".join(lines)


def test_shared_system_prompt_hits_the_cache(capsys: pytest.CaptureFixture[str]) -> None:
    report = asyncio.run(load_example("shared_system_prompt").main(max_tokens=2, device="cpu"))
    out = capsys.readouterr().out
    assert len(report.outputs) == 16 and out.count(" cached] ") == 16
    assert f"hit rate {report.hit_rate:.1%}" in out
    assert report.best_hit_rate > 0.8  # the system prompt is most of every prompt
    # The scheduler computes the shared prefix once: all but one request read it from the cache.
    assert 0.95 * report.best_hit_rate <= report.hit_rate <= report.best_hit_rate, out


def sse_events(body: str) -> list[Any]:
    """Parse `data: ...` events; [DONE] is kept as the string "[DONE]"."""
    chunks = [c for c in body.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks), body
    return [c[6:] if c[6:] == "[DONE]" else json.loads(c[6:]) for c in chunks]


def test_fastapi_sse_app() -> None:
    asyncio.run(_fastapi_checks(load_example("fastapi_sse")))


async def _fastapi_checks(example: ModuleType) -> None:
    app = example.create_app(EngineConfig(device="cpu"))
    async with app.router.lifespan_context(app):  # httpx's ASGITransport does not run the lifespan
        engine = app.state.engine
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            messages = [{"role": "user", "content": "Name a color."}]
            req = {"prompt": messages, "max_tokens": 12, "temperature": 0}
            sse = await client.post("/generate", json=req)
            assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
            events = sse_events(sse.text)
            assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
            *deltas, last = events[:-1]
            assert all(e["finish_reason"] is None and e["usage"] is None for e in deltas)
            assert last["finish_reason"] in ("stop", "length") and last["usage"]["prompt_tokens"] > 0
            streamed = "".join(e["delta"] for e in events[:-1])

            greedy = await engine.complete(messages, SamplingParams(temperature=0, max_tokens=12))
            assert streamed == greedy.text
            done = await client.post("/complete", json=req)
            assert done.status_code == 200 and done.json()["text"] == greedy.text
            # radixserve's own app, mounted under /llm over the same engine.
            chat = {"model": engine.config.model, "messages": messages, "max_tokens": 12, "temperature": 0}
            mounted = await client.post("/llm/v1/chat/completions", json=chat)
            assert mounted.status_code == 200, mounted.text
            assert mounted.json()["choices"][0]["message"]["content"] == greedy.text
            metrics = await client.get("/llm/metrics")
            assert "radixserve_generation_tokens_total" in metrics.text

            bad = await client.post("/generate", json={**req, "temperature": -1})
            assert bad.status_code == 400 and "temperature" in bad.json()["detail"]
            too_long = await client.post("/generate", json={**req, "prompt": "word " * 9000})
            assert too_long.status_code == 400 and "context" in too_long.json()["detail"]
            for path in ("/generate", "/complete"):  # a malformed chat message is the caller's error
                no_role = await client.post(path, json={**req, "prompt": [{"content": "hi"}]})
                assert no_role.status_code == 400 and "role" in no_role.json()["detail"], no_role.text
                role = await client.post(path, json={**req, "prompt": [{"role": "wizard", "content": "hi"}]})
                assert role.status_code == 400 and "role" in role.json()["detail"], role.text
            again = await client.post("/complete", json=req)  # and the app serves on
            assert again.status_code == 200 and again.json()["text"] == greedy.text

        for spec_version in ("2.0", "2.4"):  # Starlette watches for disconnects only before 2.4
            await _disconnect_aborts(app, engine, spec_version)
        await engine.check_integrity()


async def _disconnect_aborts(app: Any, engine: Any, spec_version: str) -> None:
    """A client that leaves after the first event: the request is aborted, not run to the end."""
    body = json.dumps({"prompt": "Count from one to a thousand:", "max_tokens": 400}).encode()
    first_event = asyncio.Event()
    sent: list[bytes] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await first_event.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])
            first_event.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/generate",
        "raw_path": b"/generate",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    assert sent and b"[DONE]" not in b"".join(sent)
    stats = await engine.stats()  # queued behind the abort on the worker's inbox
    assert stats["running"] == 0 and stats["waiting"] == 0
