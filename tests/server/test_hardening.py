"""The server's defaults against hostile clients, each case over HTTP to a live uvicorn server.

One client's huge body never stalls the others (the event loop stays free), an
empty API key is a start-up error, a web page cannot drive a local server
(Host allowlist, JSON-only POST bodies, cross-origin POSTs refused, no CORS
unless asked, no state change on GET), deeply nested JSON is a 400 naming the
limit, and idle keep-alive connections are closed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from radixserve import AsyncEngine, EngineConfig
from radixserve.server import ServerLimits, create_app
from radixserve.server.runner import ServerThread

from .conftest import MODEL

KEY = "hardening-key"
AUTH = {"authorization": f"Bearer {KEY}"}
ALLOWED_ORIGIN = "https://app.example"
KEEP_ALIVE_S = 2
STALL_S = 0.100  # the bound: a blocked loop shows up as seconds, a busy one as milliseconds
STREAM_SLACK_S = 1.0  # a stream gap beyond the slowest decode step seen before (CPU noise)
LIMITS = ServerLimits()  # the defaults a user gets: 4 MiB bodies, 1 Mi-character prompts, depth 128


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    engine = AsyncEngine(EngineConfig(model=MODEL, device="cpu", dtype="float32"))
    kw = {"api_key": KEY, "limits": LIMITS, "cors_origins": (ALLOWED_ORIGIN,), "keep_alive_s": KEEP_ALIVE_S}
    with ServerThread(engine, **kw) as s:
        yield s


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict[str, str]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and "Traceback" not in r.text
    return err  # type: ignore[no-any-return]


def huge_body(chars: int) -> bytes:
    text = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
    return json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode()


@dataclass
class Bystanders:
    """Another client's stream, /health probes and the server loop's own lateness, meanwhile."""

    server: ServerThread
    stop: threading.Event = field(default_factory=threading.Event)
    chunks: list[float] = field(default_factory=list)
    health_s: list[tuple[float, float]] = field(default_factory=list)
    lag_s: list[tuple[float, float]] = field(default_factory=list)

    def start(self) -> None:
        started = threading.Event()
        self.threads = [
            threading.Thread(target=self._stream, args=(started,), daemon=True),
            threading.Thread(target=self._health, daemon=True),
        ]
        self.threads[0].start()
        assert started.wait(60), "the bystander's stream never started"
        self.threads[1].start()
        self.lag = asyncio.run_coroutine_threadsafe(self._loop_lag(), self.server.loop)  # type: ignore[arg-type]
        time.sleep(1.5)  # a baseline: how long this machine's decode steps take unloaded

    def finish(self) -> None:
        time.sleep(0.2)
        self.stop.set()
        for t in self.threads:
            t.join(60)
        self.lag.result(10)

    def _stream(self, started: threading.Event) -> None:
        body = {
            "text": "Tell a long story.",
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0},
            "stream": True,
        }
        with (
            httpx.Client(base_url=self.server.url, headers=AUTH, timeout=60) as c,
            c.stream("POST", "/generate", json=body) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.chunks.append(time.monotonic())
                    started.set()
                if self.stop.is_set():
                    break

    def _health(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=30) as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                assert c.get("/health").status_code == 200
                self.health_s.append((t0, time.monotonic() - t0))
                time.sleep(0.005)

    async def _loop_lag(self) -> None:
        """How late a 5 ms sleep on the server's loop wakes up: the loop's stall, directly."""
        while not self.stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.005)
            self.lag_s.append((t0, time.monotonic() - t0 - 0.005))

    def report(self, start: float, end: float) -> tuple[float, float, float, float]:
        """Max loop lag, max /health latency, max stream gap inside [start, end], and before it."""
        stream = [t for t in self.chunks if t <= end + 0.2]
        gaps = [(a, b - a) for a, b in zip(stream, stream[1:])]
        during = [g for a, g in gaps if a + g >= start]
        before = [g for a, g in gaps if a + g < start]
        assert len(during) >= 2 and before, f"the stream produced {len(during)} chunks meanwhile"
        lag = max(s for t, s in self.lag_s if t >= start)
        health = max(s for t, s in self.health_s if t >= start)
        print(
            f"\nwindow {end - start:.2f} s: loop lag {lag * 1e3:.0f} ms, /health {health * 1e3:.0f} ms, "
            f"stream gap {max(during) * 1e3:.0f} ms (before: {max(before) * 1e3:.0f} ms, "
            f"{len(during)} chunks meanwhile)"
        )
        return lag, health, max(during), max(before)


def send_all(server: ServerThread, bodies: list[bytes]) -> tuple[list[dict[str, str]], float, float]:
    """POST every body to /generate at once; their errors and the window they took."""
    answers: list[httpx.Response] = []

    def send(data: bytes) -> None:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
            answers.append(c.post("/generate", content=data, headers={"content-type": "application/json"}))

    threads = [threading.Thread(target=send, args=(d,), daemon=True) for d in bodies]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    end = time.monotonic()
    assert len(answers) == len(bodies)
    return [error_of(r, 400) for r in answers], start, end


@pytest.mark.timeout(120)
def test_huge_bodies_never_stall_another_clients_stream_or_health(server: ServerThread) -> None:
    """The issue's case: four 4 MB prompts, over the character limit, refused without tokenizing."""
    bystanders = Bystanders(server)
    bystanders.start()
    errors, start, end = send_all(server, [huge_body(LIMITS.max_body_bytes - 200)] * 4)
    bystanders.finish()
    assert all(e["code"] == "prompt_too_long" and "max_prompt_chars" in e["message"] for e in errors)
    lag, health, gap, gap_before = bystanders.report(start, end)
    assert lag <= STALL_S and health <= STALL_S  # the loop itself: the bound
    # A stream chunk also waits for a decode step, which shares 2 busy cores with the uploads
    # (tens to hundreds of ms here): the stream goes on, with no stall like the seconds the
    # loop was blocked for before (3-16 s on this machine).
    assert gap <= gap_before + STREAM_SLACK_S


@pytest.mark.timeout(120)
def test_long_prompts_are_tokenized_off_the_event_loop(server: ServerThread) -> None:
    """Four prompts of 200,000 characters (under the limit, ~0.3 s of tokenizing each, which
    blocked the loop before): tokenized in a thread, then too long for the context."""
    bystanders = Bystanders(server)
    bystanders.start()
    errors, start, end = send_all(server, [huge_body(200_000)] * 4)
    bystanders.finish()
    assert all(e["code"] == "context_length_exceeded" for e in errors), errors
    lag, health, _, _ = bystanders.report(start, end)
    # The stream keeps producing (checked in report); its steps share the CPU with the
    # tokenizer, so only the loop's own stalls are bounded here.
    assert lag <= STALL_S and health <= STALL_S


def test_prompt_character_limit_answers_400_naming_it(server: ServerThread, http: httpx.Client) -> None:
    text = "x" * (LIMITS.max_prompt_chars + 1)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    for path, body in (
        ("/generate", {"text": text}),
        ("/v1/completions", {"model": MODEL, "prompt": text}),
        ("/v1/chat/completions", chat),
    ):
        err = error_of(http.post(path, json=body), 400)
        assert "max_prompt_chars" in err["message"] and str(LIMITS.max_prompt_chars) in err["message"], path
    assert http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}}).is_success


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def test_deep_json_is_a_400_naming_the_limit(server: ServerThread, http: httpx.Client) -> None:
    limit = LIMITS.max_json_depth
    for depth in (limit + 1, 10_000):
        deep = ("[" * depth + "]" * depth).encode()
        for path, body in (
            ("/generate", b'{"text": "hi", "x": ' + deep + b"}"),
            ("/abort_request", b'{"rid": "r", "x": ' + deep + b"}"),
            ("/v1/chat/completions", deep),
            ("/v1/completions", b'{"model": "m", "prompt": ' + deep + b"}"),
        ):
            r = http.post(path, content=body, headers={"content-type": "application/json"})
            err = error_of(r, 400)
            assert err["code"] == "json_too_deep" and "max_json_depth" in err["message"], (path, depth)
            assert str(limit) in err["message"]
    # At the limit the body is parsed (and the unknown key ignored); a real schema passes too.
    at_limit = {"rid": "no-such-request", "x": nested(limit - 1)}
    assert http.post("/abort_request", json=at_limit).status_code == 200
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "array", "items": {"type": "integer"}}}}
        },
        "required": ["a"],
    }
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Give JSON."}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    }
    assert http.post("/v1/chat/completions", json=chat).status_code == 200
    bad = http.post("/generate", content=b'{"text": "hi"', headers={"content-type": "application/json"})
    assert error_of(bad, 400)["code"] == "invalid_json"


def test_cross_site_requests_are_refused(server: ServerThread, http: httpx.Client) -> None:
    gen = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
    data = json.dumps(gen)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        err = error_of(http.post("/generate", content=data, headers={"content-type": ctype}), 415)
        assert "application/json" in err["message"]
    with httpx.Client(base_url=server.url, timeout=30) as anon:  # no key: the 415 comes first
        assert anon.post("/generate", content=data, headers={"content-type": "text/plain"}).status_code == 415
    assert error_of(http.post("/generate", content=data), 415)  # a body without a content type
    # A JSON POST that a page on another site made the browser send: refused, whatever the body.
    evil = {"origin": "https://evil.example"}
    assert error_of(http.post("/generate", json=gen, headers=evil), 403)["code"] == "cross_origin_refused"
    assert "access-control-allow-origin" not in http.get("/v1/models", headers=evil).headers
    preflight = {"origin": "https://evil.example", "access-control-request-method": "POST"}
    assert http.options("/generate", headers=preflight).status_code == 400
    # The origin the server was started with (--cors-origins) may call it and read the answer.
    ok = {"origin": ALLOWED_ORIGIN}
    r = http.post("/generate", json=gen, headers=ok)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    r = http.options("/generate", headers={**ok, "access-control-request-method": "POST"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    # State changes are POST only; a body-less POST (SGLang's clients) needs no content type.
    assert http.get("/flush_cache").status_code == 405
    assert http.post("/flush_cache").status_code == 200


def test_host_allowlist_stops_dns_rebinding(server: ServerThread, http: httpx.Client) -> None:
    port = server.url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", "localhost"):
        assert http.get("/v1/models", headers={"host": host}).status_code == 200, host
    for host in (f"evil.example:{port}", "127.0.0.1.evil.example", "10.0.0.1"):
        assert http.get("/v1/models", headers={"host": host}).status_code == 400, host

    async def allowlist(hosts: list[str]) -> list[int]:
        app = create_app(server.engine, allowed_hosts=hosts)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://any.example"
        ) as c:
            return [(await c.get(path)).status_code for path in ("/v1/models", "/health")]

    assert server.call(lambda: allowlist(["*"])) == [200, 200]
    assert server.call(lambda: allowlist(["*.example"])) == [200, 200]
    assert server.call(lambda: allowlist(["localhost"])) == [400, 400]
    with pytest.raises(ValueError, match="allowed_hosts"):
        create_app(server.engine, allowed_hosts=["bad*host"])


def test_an_empty_api_key_is_a_start_up_error(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixserve.cli import main

    for key in ("", "   "):
        with pytest.raises(ValueError, match="API key is empty"):
            create_app(server.engine, api_key=key)
        assert main(["serve", "--api-key", key, "--port", "0"]) == 2
        assert "API key is empty" in capsys.readouterr().err
    monkeypatch.setenv("RADIXSERVE_API_KEY", "")
    assert main(["serve", "--port", "0"]) == 2
    assert "RADIXSERVE_API_KEY" in capsys.readouterr().err
    with httpx.Client(base_url=server.url, timeout=30) as anon:  # and a key, once set, is required
        assert error_of(anon.post("/generate", json={"text": "Hi"}), 401)["code"] == "invalid_api_key"


def test_idle_keep_alive_connections_are_closed(server: ServerThread) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert sock.recv(4096) == b""  # the server closed the idle connection
        assert KEEP_ALIVE_S - 0.5 <= time.monotonic() - t0 <= KEEP_ALIVE_S + 10
