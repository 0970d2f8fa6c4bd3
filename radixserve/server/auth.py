"""The API key check: `Authorization: Bearer <key>`, compared in constant time.

A dependency of the whole app; the paths in `PUBLIC_PATHS` (liveness probes)
answer without a key.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from radixserve.server.errors import APIError

PUBLIC_PATHS = frozenset({"/health"})


def route_path(request: Request) -> str:
    """The path inside this app, without the prefix it is mounted under."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


async def require_api_key(request: Request) -> None:
    key: str | None = request.app.state.settings.api_key
    if key is None or route_path(request) in PUBLIC_PATHS:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if not given and request.headers.get("x-api-key"):  # some clients send this header instead
        scheme, given = "bearer", request.headers["x-api-key"]
    if scheme.lower() != "bearer" or not given:
        raise APIError(401, "missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key")
    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise APIError(401, "incorrect API key provided", code="invalid_api_key")
