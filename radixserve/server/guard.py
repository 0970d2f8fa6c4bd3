"""What keeps a web page from driving a server on the same machine (cross-site requests).

A page on another site can make the browser send a "simple" cross-origin
request (a form-encoded or `text/plain` POST, no preflight) to
`http://localhost:8000`. `RequestGuard` refuses, before the body is read:

- a request that changes state (POST, PUT, PATCH, DELETE) carrying an `Origin`
  header that is neither the server's own origin nor one of `cors_origins`
  (browsers send `Origin` on every cross-origin POST; API clients send none):
  403;
- such a request with a body that is not JSON: 415 (the routes speak JSON
  only; a body-less POST such as `/flush_cache` needs no content type).

DNS rebinding (a page whose host name turns into 127.0.0.1) is stopped by the
Host allowlist (starlette's `TrustedHostMiddleware`, set up in `create_app`).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.server.errors import send_error

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_json(content_type: str) -> bool:
    """`application/json` or `application/<x>+json`, with any parameters (charset)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    def __init__(self, app: ASGIApp, cors_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.any_origin = "*" in cors_origins
        self.origins = frozenset(o.rstrip("/").lower() for o in cors_origins)

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if self.any_origin or origin in self.origins:
            return True
        # Same origin: the app's own pages (FastAPI's /docs) post with Origin equal to Host.
        return host is not None and urlsplit(origin).netloc == host.lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, headers.get("host")):
            await send_error(
                send,
                403,
                f"cross-origin {scope['method']} from {origin} refused: this server allows no other "
                "origins (start it with --cors-origins to allow some)",
                code="cross_origin_refused",
            )
            return
        content_type = headers.get("content-type")
        has_body = (
            content_type is not None
            or headers.get("content-length", "0") != "0"
            or "transfer-encoding" in headers
        )
        if has_body and not is_json(content_type or ""):
            await send_error(
                send,
                415,
                f"request bodies must be JSON: send `Content-Type: application/json` "
                f"(got {content_type or 'no content type'})",
                code="unsupported_media_type",
            )
            return
        await self.app(scope, receive, send)
