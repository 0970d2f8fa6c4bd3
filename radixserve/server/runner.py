"""Running the app with uvicorn: `serve()` in the current loop, `ServerThread` in a thread of its own.

`serve()` owns the engine's lifetime: it starts the engine, serves until told
to stop (Ctrl-C / SIGTERM, or `should_exit`), lets uvicorn finish in-flight
responses for up to `graceful_s`, cancels what is left (which aborts those
engine requests), then shuts the engine down.

`ServerThread` runs the same on a background thread with its own event loop
(uvloop when installed): tests, benchmarks and notebooks get a live server on
127.0.0.1 and a way to run coroutines on the engine's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import signal
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from radixserve.event_loops import new_event_loop

if TYPE_CHECKING:
    import uvicorn

    from radixserve.engine import AsyncEngine
    from radixserve.server.limits import ServerLimits

T = TypeVar("T")


def _uvicorn_server(
    app: Any, sock: socket.socket, graceful_s: float, log_level: str, keep_alive_s: int
) -> uvicorn.Server:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # serve() handles signals in its loop: uvicorn's own handlers would re-raise
            # SIGINT after the graceful stop and cancel the engine's shutdown.
            yield

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(graceful_s)),
        # An idle keep-alive connection is closed after this long. uvicorn (0.55) has no
        # timeout for reading a request's headers; its h11 parser bounds their size (16 KiB).
        timeout_keep_alive=keep_alive_s,
        lifespan="off",  # the engine's lifetime is ours, not the app's
        access_log=False,
    )
    return Server(config)


def default_allowed_hosts(bind_host: str) -> tuple[str, ...]:
    """The Host names served by default: loopback, plus the bound address when it is one
    address (clients then reach it by that address); a wildcard bind adds nothing."""
    from radixserve.server.app import LOOPBACK_HOSTS

    try:
        ip = ipaddress.ip_address(bind_host)
    except ValueError:  # a host name, e.g. localhost or the machine's name
        return LOOPBACK_HOSTS if bind_host in LOOPBACK_HOSTS else (*LOOPBACK_HOSTS, bind_host)
    if ip.is_unspecified or ip.is_loopback:
        return LOOPBACK_HOSTS
    return (*LOOPBACK_HOSTS, f"[{ip}]" if ip.version == 6 else str(ip))


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def serve(
    engine: AsyncEngine,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    model_name: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    cors_origins: Sequence[str] = (),
    keep_alive_s: int = 5,
    graceful_s: float = 30.0,
    log_level: str = "info",
    on_ready: Callable[[uvicorn.Server, str], None] | None = None,
) -> None:
    """Start `engine`, serve it on host:port until stopped, then shut it down.

    `allowed_hosts` None: `default_allowed_hosts(host)`."""
    from radixserve.server.app import create_app

    if keep_alive_s < 1:
        raise ValueError(f"keep_alive_s={keep_alive_s}: must be >= 1")
    # Built before the engine starts: a bad setting fails at once, not after the model loads.
    app = create_app(
        engine,
        api_key=api_key,
        limits=limits,
        model_name=model_name,
        allowed_hosts=default_allowed_hosts(host) if allowed_hosts is None else allowed_hosts,
        cors_origins=cors_origins,
    )
    sock = bind(host, port)
    async with engine:
        server = _uvicorn_server(app, sock, graceful_s, log_level, keep_alive_s)
        bound = sock.getsockname()
        url = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}"
        if on_ready is not None:
            loop = asyncio.get_running_loop()
            loop.call_soon(lambda: _when_started(server, url, on_ready))
        with _stop_on_signals(server):
            await server.serve(sockets=[sock])


@contextlib.contextmanager
def _stop_on_signals(server: uvicorn.Server) -> Iterator[None]:
    """SIGINT / SIGTERM: stop gracefully; a second SIGINT: stop now (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()

    def stop(sig: int) -> None:
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        loop.add_signal_handler(sig, stop, sig)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


def _when_started(server: uvicorn.Server, url: str, on_ready: Callable[[uvicorn.Server, str], None]) -> None:
    if server.started:
        on_ready(server, url)
    else:
        asyncio.get_running_loop().call_later(0.02, _when_started, server, url, on_ready)


class ServerThread:
    """A live server on a background thread: `with ServerThread(engine) as s: ... s.url ...`."""

    def __init__(self, engine: AsyncEngine, **serve_kw: Any) -> None:
        self.engine = engine
        self.serve_kw = {"log_level": "warning", "port": 0, **serve_kw}
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="radixserve-server", daemon=True)

    def start(self, timeout: float = 300.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server did not start within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the server failed to start: {self._error!r}") from self._error
        return self

    def _run(self) -> None:
        self.loop = new_event_loop()

        def ready(server: uvicorn.Server, url: str) -> None:
            self._server, self.url = server, url
            self._ready.set()

        try:
            self.loop.run_until_complete(serve(self.engine, on_ready=ready, **self.serve_kw))
        except BaseException as e:
            self._error = e
        finally:
            self._ready.set()
            self.loop.close()

    def call(self, coro_fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 120.0) -> T:
        """Run `coro_fn()` on the server's loop (where the engine lives) and return its result."""
        assert self.loop is not None
        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro_fn(), self.loop)
        return fut.result(timeout)

    def stop(self, timeout: float = 120.0) -> None:
        if self._server is not None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(setattr, self._server, "should_exit", True)
        self._thread.join(timeout)
        if self._error is not None and not isinstance(self._error, (KeyboardInterrupt, SystemExit)):
            raise RuntimeError(f"the server thread failed: {self._error!r}") from self._error

    @property
    def app(self) -> Any:
        assert self._server is not None
        return self._server.config.app

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
