"""One live server on 127.0.0.1 (uvicorn in a thread, the embedded model) for the server tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import AsyncEngine, EngineConfig
from radixserve.server import ServerLimits
from radixserve.server.runner import ServerThread

MODEL = "smollm2-135m-instruct"
API_KEY = "test-key-123"
LIMITS = ServerLimits(max_body_bytes=256 * 1024, max_queued_requests=512)


@pytest.fixture(scope="session")
def live() -> Iterator[ServerThread]:
    engine = AsyncEngine(EngineConfig(model=MODEL, device="cpu", dtype="float32"))
    with ServerThread(engine, api_key=API_KEY, limits=LIMITS) as server:
        yield server


@pytest.fixture(scope="session")
def client(live: ServerThread) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def settled(live: ServerThread) -> dict[str, Any]:
    """The engine's stats once nothing runs, after asserting every KV slot is accounted for."""
    engine = live.engine

    async def check() -> dict[str, Any]:
        import asyncio

        for _ in range(200):  # aborts of vanished clients reach the worker between steps
            s = await engine.stats()
            if s["running"] == 0 and s["waiting"] == 0:
                break
            await asyncio.sleep(0.05)
        assert s["running"] == 0 and s["waiting"] == 0, s
        await engine.check_integrity()
        return await engine.stats()

    return live.call(check)


def start_serve(api_key: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`radixserve serve` in its own process on a free port, as a user starts it (`args`: more
    flags); returns the process (its stderr still open) and its URL once it says it is ready."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "radixserve", "serve", "--port", "0", "--device", "cpu"]
    cmd += ["--api-key", api_key, *args]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, cwd=root)
    assert proc.stderr is not None
    for line in proc.stderr:  # the ready line, after the model loaded
        m = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    proc.wait()
    raise AssertionError("the server never said it was ready")
