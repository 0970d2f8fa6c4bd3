"""httpx2 transports that run an ASGI app in process: no port, no subprocess.

The openai package (3.x) sends its requests through an `httpx2` client; with
`InProcessTransport` (sync) or `AsyncInProcessTransport` (async) as that client's
transport, `openai.OpenAI` / `openai.AsyncOpenAI` talk to radixserve's app directly.

The app runs on one given event loop, the *app loop*: an `AsyncEngine` serves only the
loop it was started in, so the app must run there (httpx2's own `ASGITransport` runs the
app in the caller's loop and buffers the whole body, which breaks both that rule and
streaming). The sync transport submits to the app loop from its own thread and waits; the
async one awaits from any loop (or runs directly when called on the app loop itself).
Responses stream: each body chunk the app sends reaches the client as it is sent, and
closing a response early tells the app that the client disconnected (so a streaming
completion is aborted). Waits are bounded by the request's read timeout (`httpx2.ReadTimeout`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, MutableMapping
from typing import Any, TypeVar

import httpx2

T = TypeVar("T")
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]
CLIENT_ADDRESS = ("127.0.0.1", 123)  # what the app sees as the peer (httpx2's ASGITransport's)


class _Exchange:
    """One request/response with the app, living on the app loop: the app runs as a task,
    its messages queue up for the client, and `disconnect()` ends the request for the app."""

    def __init__(self, app: ASGIApp, scope: dict[str, Any], body: bytes) -> None:
        self._body: bytes | None = body
        self._gone = asyncio.Event()
        self._queue: asyncio.Queue[Message | BaseException | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run(app, scope))

    async def _run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self._receive, self._send)
        except Exception as e:  # noqa: BLE001 - handed to the client, as ASGITransport raises it
            self._queue.put_nowait(e)
        finally:
            self._queue.put_nowait(None)

    async def _receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self._gone.is_set():
            raise OSError("the in-process client closed the response")
        self._queue.put_nowait(message)

    async def next_message(self) -> Message | None:
        """The app's next message; None once it has returned. Raises the app's exception."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item is None:
            self._queue.put_nowait(None)  # stays at the end for later calls
        return item

    async def start(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        while (m := await self.next_message()) is not None:
            if m["type"] == "http.response.start":
                return int(m["status"]), [(bytes(k), bytes(v)) for k, v in m.get("headers", [])]
        raise RuntimeError("the app returned without starting a response")

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        while (m := await self.next_message()) is not None:
            if m["type"] == "http.response.body":
                body = bytes(m.get("body", b""))
                if not m.get("more_body", False):
                    self._gone.set()  # the response is complete: receive() says so
                    return body or None
                if body:
                    return body
        return None

    async def disconnect(self) -> None:
        self._gone.set()
        if not self._task.done():
            await asyncio.wait({self._task}, timeout=5.0)  # the app sees the disconnect and ends
            self._task.cancel()


def _scope(request: httpx2.Request) -> dict[str, Any]:
    """The ASGI scope of `request` (as httpx2's ASGITransport builds it)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "scheme": request.url.scheme,
        "path": request.url.path,
        "raw_path": request.url.raw_path.split(b"?")[0],
        "query_string": request.url.query,
        "server": (request.url.host, request.url.port),
        "client": CLIENT_ADDRESS,
        "root_path": "",
    }


def _read_timeout(request: httpx2.Request) -> float | None:
    timeout = request.extensions.get("timeout") or {}
    value = timeout.get("read")
    return float(value) if value is not None else None


class AppLoop:
    """Runs coroutines on the app loop, from its own thread or from another."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @property
    def running(self) -> bool:
        return not self.loop.is_closed() and self.loop.is_running()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run `coro` on the app loop and wait for it in this (other) thread."""
        if not self.running:
            coro.close()
            raise RuntimeError("the app's event loop is not running")
        if _on_loop(self.loop):  # waiting here would block the loop that has to do the work
            coro.close()
            raise RuntimeError("the sync in-process client was called on the app's own event loop: use async")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise httpx2.ReadTimeout("the in-process app did not answer in time") from None

    async def acall(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Await `coro` on the app loop from any asyncio loop."""
        try:
            if _on_loop(self.loop):
                return await asyncio.wait_for(coro, timeout)
            if not self.running:
                coro.close()
                raise RuntimeError("the app's event loop is not running")
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        except asyncio.TimeoutError:
            raise httpx2.ReadTimeout("the in-process app did not answer in time") from None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _open(app: ASGIApp, request: httpx2.Request, body: bytes) -> tuple[_Exchange, int, list[Any]]:
    exchange = _Exchange(app, _scope(request), body)
    try:
        status, headers = await exchange.start()
    except BaseException:
        await exchange.disconnect()
        raise
    return exchange, status, headers


class _SyncBody(httpx2.SyncByteStream):
    def __init__(self, runner: AppLoop, exchange: _Exchange, timeout: float | None) -> None:
        self._runner, self._exchange, self._timeout = runner, exchange, timeout

    def __iter__(self) -> Iterator[bytes]:
        while (chunk := self._runner.call(self._exchange.next_chunk(), self._timeout)) is not None:
            yield chunk

    def close(self) -> None:
        if self._runner.running:  # else the app, and its loop, are gone already
            self._runner.call(self._exchange.disconnect(), None)


class _AsyncBody(httpx2.AsyncByteStream):
    def __init__(self, runner: AppLoop, exchange: _Exchange, timeout: float | None) -> None:
        self._runner, self._exchange, self._timeout = runner, exchange, timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._runner.acall(self._exchange.next_chunk(), self._timeout)) is not None:
            yield chunk

    async def aclose(self) -> None:
        if self._runner.running:
            await self._runner.acall(self._exchange.disconnect(), None)


class InProcessTransport(httpx2.BaseTransport):
    """A sync httpx2 transport that runs `app` on the event loop `loop` (running in another thread)."""

    def __init__(self, app: ASGIApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self._runner = app, AppLoop(loop)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        timeout = _read_timeout(request)
        body = request.read()
        exchange, status, headers = self._runner.call(_open(self.app, request, body), timeout)
        return httpx2.Response(status, headers=headers, stream=_SyncBody(self._runner, exchange, timeout))


class AsyncInProcessTransport(httpx2.AsyncBaseTransport):
    """An async httpx2 transport that runs `app` on the event loop `loop` (any thread)."""

    def __init__(self, app: ASGIApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self._runner = app, AppLoop(loop)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeout = _read_timeout(request)
        body = await request.aread()
        exchange, status, headers = await self._runner.acall(_open(self.app, request, body), timeout)
        return httpx2.Response(status, headers=headers, stream=_AsyncBody(self._runner, exchange, timeout))
