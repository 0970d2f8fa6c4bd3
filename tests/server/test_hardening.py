"""The server's defaults against hostile clients, each case over HTTP to a live uvicorn server.

One client's huge body never stalls the others (the event loop stays free), an
empty API key is a start-up error, a web page cannot drive a local server
(Host allowlist, JSON-only POST bodies, no CORS unless asked, no state change
on GET), and deeply nested JSON is a 400 naming the limit, never a 500.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from radixserve import AsyncEngine, EngineConfig
from radixserve.server import ServerLimits
from radixserve.server.runner import ServerThread

from .conftest import MODEL

KEY = "hardening-key"
AUTH = {"authorization": f"Bearer {KEY}"}
GAP_S = 0.100  # the bound: a stalled loop shows up as seconds, a busy one as milliseconds


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    """Default limits (4 MiB bodies, 1 Mi-character prompts): the ones a user gets."""
    engine = AsyncEngine(EngineConfig(model=MODEL, device="cpu", dtype="float32"))
    with ServerThread(engine, api_key=KEY, limits=ServerLimits(), cors_origins=("https://app.example",)) as s:
        yield s


def _huge_body(chars: int) -> bytes:
    text = ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
    return b'{"text": "' + text.encode() + b'", "sampling_params": {"max_new_tokens": 1}}'


@pytest.mark.timeout(240)
def test_huge_bodies_never_stall_another_clients_stream_or_health(server: ServerThread) -> None:
    limits = ServerLimits()
    # Four bodies over the character limit (rejected before tokenizing) and four just under
    # it (tokenized off the event loop, then rejected as longer than the context).
    over = _huge_body(limits.max_body_bytes - 200)
    under = _huge_body(limits.max_prompt_chars - 100)
    stop = threading.Event()
    chunk_times: list[float] = []
    health_s: list[float] = []
    statuses: list[int] = []
    errors: list[str] = []
    body = {
        "text": "Tell a long story.",
        "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    streaming = threading.Event()

    def stream() -> None:
        with (
            httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c,
            c.stream("POST", "/generate", json=body) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk_times.append(time.monotonic())
                    streaming.set()
                if stop.is_set():
                    break

    def health() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                assert c.get("/health").status_code == 200
                health_s.append(time.monotonic() - t0)
                time.sleep(0.005)

    def huge(data: bytes) -> None:
        try:
            with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
                r = c.post("/generate", content=data, headers={"content-type": "application/json"})
                statuses.append(r.status_code)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(e))

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    assert streaming.wait(60), "the stream never started"
    prober = threading.Thread(target=health, daemon=True)
    prober.start()
    time.sleep(0.3)
    start = time.monotonic()
    senders = [threading.Thread(target=huge, args=(d,), daemon=True) for d in [over] * 4 + [under] * 4]
    for t in senders:
        t.start()
    for t in senders:
        t.join(120)
    end = time.monotonic()
    time.sleep(0.2)
    stop.set()
    streamer.join(60)
    prober.join(30)
    assert not errors and statuses == [400] * 8, (statuses, errors)
    window = [t for t in chunk_times if start <= t <= end + 0.2]
    gaps = [b - a for a, b in zip(window, window[1:])]
    assert len(window) >= 3, f"the stream produced {len(window)} chunks in {end - start:.2f} s"
    print(
        f"huge bodies took {end - start:.2f} s; max stream gap {max(gaps) * 1e3:.0f} ms, "
        f"max /health latency {max(health_s) * 1e3:.0f} ms over {len(health_s)} probes"
    )
    assert max(gaps) <= GAP_S, f"a stream chunk waited {max(gaps) * 1e3:.0f} ms"
    assert max(health_s) <= GAP_S, f"/health waited {max(health_s) * 1e3:.0f} ms"
