"""`create_app(engine)`: the FastAPI app over one `AsyncEngine` that the caller owns.

The app never starts or stops the engine: the caller does (`async with
engine:` around `uvicorn.Server.serve()`, or its own lifespan), so the app
mounts into an existing service next to other routes. State on `app.state`:
`engine`, `settings` (a `ServerSettings`), `metrics` and `gate` (admission).
Routers: OpenAI-compatible (`openai_api`), SGLang-native (`native`), `/metrics`.

Safe by default for a server on a developer's machine: only the Host names in
`allowed_hosts` are served (localhost, 127.0.0.1, [::1]: a DNS-rebinding page
gets a 400), POST bodies must be JSON (415), cross-origin POSTs are refused
(403) and no CORS headers are sent unless `cors_origins` names origins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from radixserve.server.auth import require_api_key
from radixserve.server.errors import install_error_handlers
from radixserve.server.guard import RequestGuard
from radixserve.server.limits import AdmissionGate, BodyLimit, ServerLimits
from radixserve.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from radixserve.engine import AsyncEngine


# The Host header values served by default: the loopback names (no DNS rebinding).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # the id /v1/models lists and responses carry
    api_key: str | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS  # "*" serves any Host
    cors_origins: tuple[str, ...] = ()  # none: no CORS headers, cross-origin POSTs refused

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError(
                "the API key is empty: give a non-empty key, or none at all to serve without one"
            )
        if not self.allowed_hosts:
            raise ValueError("allowed_hosts is empty: no request could be served (give '*' to allow any)")
        for host in self.allowed_hosts:
            if not host or "*" in host[1:] or (host.startswith("*") and host != "*" and host[1] != "."):
                raise ValueError(f"allowed_hosts: {host!r} is not a host name, '*' or '*.domain'")


def create_app(
    engine: AsyncEngine,
    *,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    model_name: str | None = None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    cors_origins: Sequence[str] = (),
) -> FastAPI:
    """An app serving `engine` (started or not yet: requests need it running).

    `allowed_hosts`: the Host header values served (`"*"` any; `"*.example.com"`
    a domain's); `cors_origins`: the browser origins allowed to call it (`"*"` any).
    An empty `api_key` is a `ValueError`: it would look like protection and be none."""
    from radixserve.server import native, openai_api

    settings = ServerSettings(
        model_name or engine.config.model,
        api_key,
        limits or ServerLimits(),
        tuple(allowed_hosts),
        tuple(cors_origins),
    )
    app = FastAPI(title="radixserve", dependencies=[Depends(require_api_key)])
    app.state.engine = engine
    app.state.settings = settings
    app.state.metrics = ServerMetrics()
    app.state.gate = AdmissionGate(settings.limits.max_queued_requests)
    # Long prompts are tokenized in worker threads, one at a time: a flood of them queues
    # here instead of taking every core from the engine's worker.
    app.state.tokenize_slots = asyncio.Semaphore(1)
    install_error_handlers(app)
    # The last added runs first: Host check, CORS, cross-site guard, body size, then the routes.
    app.add_middleware(BodyLimit, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(RequestGuard, cors_origins=settings.cors_origins)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PUT"],
            allow_headers=["authorization", "content-type", "x-api-key"],
        )
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts), www_redirect=False)
    app.include_router(openai_api.router)
    app.include_router(native.router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        state = request.app.state
        text = await state.metrics.render(state.engine, state.gate.in_flight)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
