"""`create_app(engine)`: the FastAPI app over one `AsyncEngine` that the caller owns.

The app never starts or stops the engine: the caller does (`async with
engine:` around `uvicorn.Server.serve()`, or its own lifespan), so the app
mounts into an existing service next to other routes. State on `app.state`:
`engine`, `settings` (a `ServerSettings`), `metrics` and `gate` (admission).
Routers: OpenAI-compatible (`openai_api`), SGLang-native (`native`), `/metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from radixserve.server.auth import require_api_key
from radixserve.server.errors import install_error_handlers
from radixserve.server.limits import AdmissionGate, BodyLimit, ServerLimits
from radixserve.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from radixserve.engine import AsyncEngine


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # the id /v1/models lists and responses carry
    api_key: str | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)


def create_app(
    engine: AsyncEngine,
    *,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    model_name: str | None = None,
) -> FastAPI:
    """An app serving `engine` (started or not yet: requests need it running)."""
    from radixserve.server import native, openai_api

    if api_key is not None and not api_key:
        raise ValueError("api_key must be a non-empty string or None")
    settings = ServerSettings(model_name or engine.config.model, api_key, limits or ServerLimits())
    app = FastAPI(title="radixserve", dependencies=[Depends(require_api_key)])
    app.state.engine = engine
    app.state.settings = settings
    app.state.metrics = ServerMetrics()
    app.state.gate = AdmissionGate(settings.limits.max_queued_requests)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.limits.max_body_bytes)
    app.include_router(openai_api.router)
    app.include_router(native.router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        state = request.app.state
        text = await state.metrics.render(state.engine, state.gate.in_flight)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
