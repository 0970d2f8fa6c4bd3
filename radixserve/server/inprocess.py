"""OpenAI clients wired to a radixserve app in process (no port, no subprocess).

    from radixserve.server import create_app, inprocess_openai

    client = inprocess_openai(create_app(engine))  # engine: a started AsyncEngine
    client.chat.completions.create(model=engine.config.model, messages=[...])

The app runs on its engine's event loop (`engine.loop`, see `inprocess_transport`): the
sync client must be used from another thread (as with `radixserve.Engine`, whose loop runs
in a thread of its own), the async one from any asyncio loop. The clients' base URL is
`http://localhost/v1`; the API key is the app's own (`create_app(api_key=...)`) unless given.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx2

from radixserve.server.inprocess_transport import AsyncInProcessTransport, InProcessTransport

if TYPE_CHECKING:
    import openai
    from fastapi import FastAPI

BASE_URL = "http://localhost/v1"
DEFAULTS: dict[str, Any] = {"max_retries": 0, "timeout": 120.0}  # a test sees the first failure


def _loop_and_key(
    app: FastAPI, loop: asyncio.AbstractEventLoop | None, api_key: str | None
) -> tuple[asyncio.AbstractEventLoop, str]:
    loop = loop or app.state.engine.loop
    if loop is None:
        raise RuntimeError("start the app's engine first: the app runs on the engine's event loop")
    return loop, api_key or app.state.settings.api_key or "in-process"


def inprocess_openai(
    app: FastAPI, *, loop: asyncio.AbstractEventLoop | None = None, api_key: str | None = None, **options: Any
) -> openai.OpenAI:
    """An `openai.OpenAI` whose requests `app` serves on `loop` (default: its engine's loop);
    `options` go to `openai.OpenAI` (defaults: `max_retries=0`, `timeout=120`)."""
    import openai

    loop, key = _loop_and_key(app, loop, api_key)
    http = httpx2.Client(transport=InProcessTransport(app, loop), base_url=BASE_URL)
    return openai.OpenAI(base_url=BASE_URL, api_key=key, http_client=http, **{**DEFAULTS, **options})


def inprocess_async_openai(
    app: FastAPI, *, loop: asyncio.AbstractEventLoop | None = None, api_key: str | None = None, **options: Any
) -> openai.AsyncOpenAI:
    """An `openai.AsyncOpenAI` whose requests `app` serves on `loop` (default: its engine's
    loop), usable from any asyncio loop; `options` as for `inprocess_openai`."""
    import openai

    loop, key = _loop_and_key(app, loop, api_key)
    http = httpx2.AsyncClient(transport=AsyncInProcessTransport(app, loop), base_url=BASE_URL)
    return openai.AsyncOpenAI(base_url=BASE_URL, api_key=key, http_client=http, **{**DEFAULTS, **options})
