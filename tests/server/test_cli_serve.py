"""`radixserve serve` as a user runs it: a process on 127.0.0.1, Ctrl-C finishes in-flight streams."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

from .conftest import MODEL, start_serve


def test_serve_streams_then_stops_cleanly_on_sigint() -> None:
    proc, url = start_serve("k")
    try:
        assert proc.stderr is not None
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


def test_serve_bad_arguments_and_missing_model(capsys: pytest.CaptureFixture[str]) -> None:
    from radixserve.cli import main

    assert main(["serve", "--port", "70000"]) == 2
    assert main(["serve", "--max-queued-requests", "0"]) == 2
    assert main(["serve", "--data-parallel-size", "0"]) == 2
    assert main(["serve", "--replicas", "2"]) == 2  # without --ray
    assert main(["serve", "--ray", "--replicas", "0"]) == 2
    assert main(["serve", "--model", "/nonexistent/model", "--port", "0"]) == 1  # a one-line error, exit 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("radixserve: error: model '/nonexistent/model' not found")


def test_serve_with_replicas_routes_by_prefix_and_reports_them() -> None:
    proc, url = start_serve("k", "--data-parallel-size", "2")
    try:
        headers = {"authorization": "Bearer k"}
        body = {"model": MODEL, "prompt": "The three laws of motion are", "max_tokens": 4}
        for _ in range(2):  # the second follows the first's prefix
            r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
            assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        metrics = httpx.get(f"{url}/metrics", headers=headers).text
        assert 'radixserve_router_decisions_total{decision="prefix"} 1.0' in metrics
        assert 'radixserve_replica_healthy{replica="0"} 1.0' in metrics
        assert 'radixserve_replica_healthy{replica="1"} 1.0' in metrics
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
