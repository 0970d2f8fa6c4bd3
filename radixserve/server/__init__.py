"""The HTTP server: `create_app(engine)` builds a FastAPI app over an `AsyncEngine` the caller owns;
`inprocess_openai(app)` / `inprocess_async_openai(app)` are OpenAI clients served by it in process.

Needs the `server` extra (fastapi, uvicorn, prometheus_client); nothing here is
imported by `import radixserve`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.server.app import ServerSettings, create_app
    from radixserve.server.inprocess import inprocess_async_openai, inprocess_openai
    from radixserve.server.limits import ServerLimits

__all__ = ["ServerLimits", "ServerSettings", "create_app", "inprocess_async_openai", "inprocess_openai"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "ServerSettings"):
        from radixserve.server import app

        return getattr(app, name)
    if name in ("inprocess_openai", "inprocess_async_openai"):  # imports openai and httpx2
        from radixserve.server import inprocess

        return getattr(inprocess, name)
    if name == "ServerLimits":
        from radixserve.server.limits import ServerLimits

        return ServerLimits
    raise AttributeError(f"module 'radixserve.server' has no attribute {name!r}")
