"""Async Django views over one shared `AsyncEngine`: a token stream (SSE) and a JSON completion.

    pip install django uvicorn radixserve
    cd examples && uvicorn django_app.asgi:application --port 8000
    curl -N localhost:8000/generate -d '{"prompt": "Hi", "max_tokens": 32}'

Under ASGI every request runs in the server's one event loop, so the engine is
created and started there on first use (an `asyncio.Lock` keeps concurrent
first requests from starting two) and then shared by all requests, which the
engine batches. Django cancels a streaming response whose client disconnects;
leaving the `async for` closes `engine.generate()`, which aborts the request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from radixserve import AsyncEngine, EngineConfig, RequestOutput, SamplingParams

_engine: AsyncEngine | None = None
_lock: asyncio.Lock | None = None


async def get_engine() -> AsyncEngine:
    """The process's engine, started in the running loop on first use."""
    global _engine, _lock
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        if _engine is None:
            config = EngineConfig(model=settings.RADIXSERVE_MODEL, device=settings.RADIXSERVE_DEVICE)
            _engine = await AsyncEngine(config).start()
    return _engine


async def shutdown_engine() -> None:
    global _engine, _lock
    if _engine is not None:
        await _engine.shutdown()
    _engine, _lock = None, None


def _parse(request: HttpRequest) -> tuple[Any, SamplingParams]:
    body = json.loads(request.body or b"{}")
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), (str, list)):
        raise ValueError("send a JSON object with a `prompt` (text or chat messages)")
    params = SamplingParams(
        max_tokens=int(body.get("max_tokens", 64)),
        temperature=float(body.get("temperature", 0.7)),
        seed=body.get("seed"),
    )
    return body["prompt"], params


@csrf_exempt
@require_POST
async def generate(request: HttpRequest) -> HttpResponse:
    try:
        prompt, params = _parse(request)
        engine = await get_engine()
        stream = engine.generate(prompt, params)
        first = await anext(stream)  # a prompt the engine rejects is still a 400
    except ValueError as e:
        return JsonResponse({"error": str(e)}, status=400)
    return StreamingHttpResponse(_events(first, stream), content_type="text/event-stream")


async def _events(first: RequestOutput, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
    async with aclosing(stream):  # type: ignore[type-var]
        out = first
        while True:
            yield f"data: {json.dumps({'delta': out.delta_text, 'finish_reason': out.finish_reason})}\n\n"
            if out.finished:
                yield "data: [DONE]\n\n"
                return
            out = await anext(stream)


@csrf_exempt
@require_POST
async def complete(request: HttpRequest) -> HttpResponse:
    try:
        prompt, params = _parse(request)
        engine = await get_engine()
        out = await engine.complete(prompt, params)
    except ValueError as e:
        return JsonResponse({"error": str(e)}, status=400)
    assert isinstance(out, RequestOutput)
    return JsonResponse(
        {"text": out.text, "finish_reason": out.finish_reason, "cached_tokens": out.usage.cached_tokens}
    )
