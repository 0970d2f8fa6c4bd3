"""Streaming a program's answer from FastAPI, token by token (Server-Sent Events).

    uvicorn examples.lang_fastapi_stream:app     # or: python examples/lang_fastapi_stream.py
    curl -N localhost:8000/ask -d '{"question": "What is a radix tree?"}' -H 'content-type: application/json'

The `AsyncEngine` starts in the app's lifespan, in uvicorn's event loop, so
`await program.arun(..., stream=True)` drives it directly, and
`state.text_async_iter("answer")` yields the answer as it is generated.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

import radixserve.lang as sgl
from radixserve import AsyncEngine, EngineConfig


@sgl.function
def answer(s: Any, question: str, max_tokens: int) -> None:
    s += sgl.system("You are a concise assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens))


class AskBody(BaseModel):
    question: str
    max_tokens: int = 64
    temperature: float = 0.0


def create_app(engine: Any = None, config: EngineConfig | None = None) -> FastAPI:
    """`engine`: an existing AsyncEngine or Engine; None starts one in the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            app.state.engine = engine
            yield
            return
        async with AsyncEngine(config or EngineConfig()) as own:
            app.state.engine = own
            yield

    app = FastAPI(title="radixserve program streaming example", lifespan=lifespan)

    @app.post("/ask")
    async def ask(body: AskBody, request: Request) -> StreamingResponse:
        state = await answer.arun(
            question=body.question,
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            stream=True,
            backend=request.app.state.engine,
        )

        async def events() -> AsyncIterator[str]:
            async for piece in state.text_async_iter("answer"):
                yield f"data: {json.dumps({'delta': piece})}\n\n"
            await state.finished()
            err = state.error()
            yield f"data: {json.dumps({'error': repr(err)} if err else {'done': True})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


app = create_app()

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)
