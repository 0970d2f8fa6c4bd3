"""JSON request bodies: parsed with a nesting limit, and off the event loop when large.

Every route of the app is a `JSONRoute`, so `await request.json()` (FastAPI's
body parsing and the native routes' own calls alike) goes through
`JSONRequest.json`: pydantic-core's parser (Rust; it refuses nesting past its
own bound instead of recursing in Python), then a walk that refuses nesting
past `ServerLimits.max_json_depth`. Bodies over `OFFLOAD_BYTES` are parsed in
a worker thread so that one client's 4 MB body does not hold up other
clients' streams. A bad body is a `BodyError`, a 400 naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio.to_thread
import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute

from radixserve.server.errors import BodyError

# Parsing 64 KiB takes well under a millisecond; past it, a thread is cheaper than the stall.
OFFLOAD_BYTES = 64 << 10


def too_deep(value: Any, limit: int) -> bool:
    """Whether objects and arrays in `value` nest deeper than `limit` (`[]` is depth 1)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:  # iterative: the depth of the input never becomes the depth of the stack
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def parse_body(data: bytes, max_depth: int) -> Any:
    """The JSON value of `data`; a `BodyError` when it is not JSON or nests past `max_depth`."""
    deep = BodyError(
        f"the request body nests objects and arrays deeper than this server's limit of {max_depth} "
        "levels (max_json_depth)",
        code="json_too_deep",
    )
    try:
        value = pydantic_core.from_json(data, cache_strings=False)
    except ValueError as e:
        if "recursion limit exceeded" in str(e):
            raise deep from None
        raise BodyError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if too_deep(value, max_depth):
        raise deep
    return value


class JSONRequest(Request):
    """A request whose `json()` is `parse_body` with the app's depth limit, in a thread when large."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            data = await self.body()
            depth: int = self.app.state.settings.limits.max_json_depth
            if len(data) > OFFLOAD_BYTES:
                self._json = await anyio.to_thread.run_sync(parse_body, data, depth)
            else:
                self._json = parse_body(data, depth)
        return self._json


class JSONRoute(APIRoute):
    """FastAPI's route with `JSONRequest` in place of the plain request (FastAPI's documented way)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JSONRequest(request.scope, request.receive))

        return route
