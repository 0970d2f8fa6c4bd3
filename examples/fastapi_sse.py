"""A FastAPI app serving one shared `AsyncEngine`: its own SSE routes next to radixserve's server.

    pip install "radixserve[server]"
    uvicorn examples.fastapi_sse:app            # or: python examples/fastapi_sse.py
    curl -N localhost:8000/generate -d '{"prompt": [{"role": "user", "content": "Hi"}]}' \
         -H 'content-type: application/json'
    curl localhost:8000/llm/v1/chat/completions -H 'content-type: application/json' \
         -d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]}'

`radixserve.server.create_app(engine)` is mounted under /llm: the
OpenAI-compatible API (`openai.OpenAI(base_url="http://localhost:8000/llm/v1")`),
the SGLang-native routes and /llm/metrics, over the same engine as this
app's own routes. The app factory never starts or stops the engine: this
app's lifespan does.

The engine starts in the app's lifespan and runs in uvicorn's event loop, so
every request is just an `async for` over `engine.generate()`; concurrent
requests are batched by the engine's scheduler and share KV through its radix
cache. `POST /generate` streams `data: {json}` per delta, then `data: [DONE]`;
when the client goes away the stream's generator is closed, which aborts the
request and frees its KV. `POST /complete` returns the final output as JSON.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from radixserve import AsyncEngine, EngineConfig, RequestOutput, SamplingParams
from radixserve.server import create_app as create_llm_app


class GenerateBody(BaseModel):
    prompt: str | list[dict[str, str]]  # text, or chat messages (the chat template is applied)
    max_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = []

    def sampling_params(self) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=self.seed,
                stop=tuple(self.stop),
            )
        except ValueError as e:  # validated here, in the handler: a 400, not a broken stream
            raise HTTPException(400, str(e)) from e


def event(out: RequestOutput) -> dict[str, Any]:
    return {
        "id": out.request_id,
        "delta": out.delta_text,
        "finish_reason": out.finish_reason,
        "usage": asdict(out.usage) if out.finished else None,
    }


def create_app(config: EngineConfig | None = None) -> FastAPI:
    engine = AsyncEngine(config or EngineConfig())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine:  # started in the server's event loop, drained on shutdown
            yield

    app = FastAPI(title="radixserve SSE example", lifespan=lifespan)
    app.state.engine = engine
    # The mounted app answers only the Host names it is told (loopback ones by default):
    # add the names your service is reached by, e.g. allowed_hosts=["localhost", "api.example.com"].
    app.mount("/llm", create_llm_app(engine))

    @app.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> StreamingResponse:
        engine: AsyncEngine = request.app.state.engine
        stream = engine.generate(body.prompt, body.sampling_params())
        try:  # the first output comes after tokenization: a bad prompt is still a 400
            first = await anext(stream)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        return StreamingResponse(sse(request, first, stream), media_type="text/event-stream")

    @app.post("/complete")
    async def complete(body: GenerateBody, request: Request) -> dict[str, Any]:
        engine: AsyncEngine = request.app.state.engine
        try:
            out = await engine.complete(body.prompt, body.sampling_params())
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        assert isinstance(out, RequestOutput)  # n is always 1 here
        return {**event(out), "text": out.text}

    return app


async def sse(
    request: Request, first: RequestOutput, stream: AsyncIterator[RequestOutput]
) -> AsyncIterator[str]:
    """Events until the request finishes; closing `stream` (disconnect, cancel) aborts it."""
    async with aclosing(stream):  # type: ignore[type-var]
        out = first
        while True:
            yield f"data: {json.dumps(event(out))}\n\n"
            if out.finished:
                yield "data: [DONE]\n\n"
                return
            if await request.is_disconnected():
                return
            out = await anext(stream)


app = create_app()

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)
