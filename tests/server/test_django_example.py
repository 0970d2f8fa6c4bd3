"""The Django example under ASGI: Django's async test client streams tokens from the shared engine."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from radixserve import SamplingParams

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_django_async_view_streams_from_one_engine() -> None:
    sys.path.insert(0, str(EXAMPLES))
    os.environ["DJANGO_SETTINGS_MODULE"] = "django_app.settings"
    os.environ["RADIXSERVE_DEVICE"] = "cpu"
    try:
        import django

        django.setup()
        from django.test import AsyncClient
        from django_app import views

        asyncio.run(_checks(AsyncClient(), views))
    finally:
        sys.path.remove(str(EXAMPLES))


async def _checks(client: Any, views: Any) -> None:
    try:
        body = {"prompt": [{"role": "user", "content": "Name a color."}], "max_tokens": 10, "temperature": 0}
        streams = await asyncio.gather(
            *(client.post("/generate", json.dumps(body), content_type="application/json") for _ in range(3))
        )
        engine = await views.get_engine()
        greedy = await engine.complete(body["prompt"], SamplingParams(max_tokens=10, temperature=0))
        for r in streams:
            assert r.status_code == 200 and r["content-type"] == "text/event-stream"
            chunks = [c.decode() if isinstance(c, bytes) else c async for c in r.streaming_content]
            events = [e[6:] for e in "".join(chunks).split("\n\n") if e]
            assert events[-1] == "[DONE]"
            assert "".join(json.loads(e)["delta"] for e in events[:-1]) == greedy.text
        done = await client.post("/complete", json.dumps(body), content_type="application/json")
        assert done.json()["text"] == greedy.text and done.json()["cached_tokens"] > 0
        bad = await client.post(
            "/generate", json.dumps({"prompt": "hi", "temperature": -1}), content_type="application/json"
        )
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]
        assert await views.get_engine() is engine  # one shared engine
        await engine.check_integrity()
    finally:
        await views.shutdown_engine()
