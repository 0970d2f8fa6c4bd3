"""What one server accepts: body size and depth, prompt size and how many requests may be in flight.

`AdmissionGate` counts completions admitted and not yet finished; past
`max_queued_requests` a new request gets a 503 at once instead of queueing
without bound. `BodyLimit` is ASGI middleware that reads a request body up to
`max_body_bytes` and answers 413 past it, before any route parses a byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.server.errors import APIError, send_error

# The JSON parser's own nesting bound (pydantic-core's jiter refuses deeper input without
# recursing in Python); `max_json_depth` may be set up to it.
PARSER_MAX_DEPTH = 200


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 4 << 20
    max_prompt_tokens: int | None = None  # None: whatever fits the engine's context
    max_queued_requests: int = 1024  # completions in flight (n counts n times)
    max_n: int = 64
    # Characters of one prompt (text, or the text of chat messages), checked before tokenizing.
    max_prompt_chars: int = 1 << 20
    # Nesting of a JSON body (objects and arrays). Real requests nest far less; 10,000-deep
    # bodies are an attack. Above the grammar layer's schema depth (GrammarLimits.max_depth,
    # 128) plus a request's own levels, so a too-deep schema gets that limit's message; the
    # body parser's own ceiling is about 200.
    max_json_depth: int = 160

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queued_requests", "max_n", "max_prompt_chars", "max_json_depth"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ServerLimits.{name}={v!r}: must be an integer >= 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"ServerLimits.max_prompt_tokens={self.max_prompt_tokens!r}: must be >= 1")
        if self.max_json_depth > PARSER_MAX_DEPTH:
            raise ValueError(
                f"ServerLimits.max_json_depth={self.max_json_depth}: at most {PARSER_MAX_DEPTH}, "
                "the JSON parser's own bound"
            )


class AdmissionGate:
    """A counter of admitted completions; `enter` raises a 503 APIError when full.

    Only touched from the event loop, so a plain int needs no lock.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_flight = 0
        self.rejected = 0

    def enter(self, weight: int = 1) -> Ticket:
        if self.in_flight + weight > self.capacity:
            self.rejected += 1
            raise APIError(
                503,
                f"the server is at capacity ({self.in_flight} of {self.capacity} requests in flight); "
                "retry later",
                code="server_overloaded",
            )
        self.in_flight += weight
        return Ticket(self, weight)


class Ticket:
    """One admission; `release` is idempotent so every exit path may call it."""

    def __init__(self, gate: AdmissionGate, weight: int) -> None:
        self._gate: AdmissionGate | None = gate
        self._weight = weight

    def release(self) -> None:
        if self._gate is not None:
            self._gate.in_flight -= self._weight
            self._gate = None

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BodyLimit:
    """Buffer the body up to `max_bytes`, answer 413 past it, then replay it to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _too_large(send, self.max_bytes)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _too_large(send, self.max_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: waits for http.disconnect

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _too_large(send: Send, limit: int) -> None:
    await send_error(send, 413, f"the request body is larger than the server's limit of {limit} bytes")
