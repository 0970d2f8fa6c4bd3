"""`radixserve serve` as a user runs it: a process on 127.0.0.1, Ctrl-C finishes in-flight streams."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from tests.server.conftest import MODEL

ROOT = Path(__file__).resolve().parents[2]


def test_serve_streams_then_stops_cleanly_on_sigint() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "radixserve", "serve", "--port", "0", "--api-key", "k", "--device", "cpu"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # the ready line, after the model loaded
            m = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
            if m:
                url = m.group(1)
                break
        assert url, "the server never said it was ready"
        headers = {"authorization": "Bearer k"}
        assert httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"] == MODEL
        assert httpx.get(f"{url}/v1/models").status_code == 401
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell a story."}],
            "max_tokens": 24,
            "stream": True,
        }
        lines: list[str] = []
        first = threading.Event()

        def client() -> None:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120
            ) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                    first.set()

        t = threading.Thread(target=client)
        t.start()
        assert first.wait(120)
        proc.send_signal(signal.SIGINT)  # mid-stream: the stream still finishes
        t.join(120)
        rest = proc.stderr.read()
        assert proc.wait(60) == 0, rest
        assert "radixserve: stopped" in rest
        assert lines[-1] == "data: [DONE]" and '"finish_reason": "length"' in "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_bad_arguments() -> None:
    from radixserve.cli import main

    assert main(["serve", "--port", "70000"]) == 2
    assert main(["serve", "--max-queued-requests", "0"]) == 2
