"""A radixserve HTTP server on 127.0.0.1 for tests: uvicorn and the engine in a thread of their own.

The engine belongs to the server thread's event loop; `call(fn)` runs
`async fn(engine)` there (e.g. `check_integrity`). One server per test module.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI

from radixserve import AsyncEngine, EngineConfig


def native_app(engine: AsyncEngine) -> FastAPI:
    """The SGLang-native router alone on a bare app."""
    from radixserve.server.native import router

    app = FastAPI()
    app.state.engine = engine
    app.include_router(router)
    return app


class LoopbackServer:
    def __init__(self, config: EngineConfig, make_app: Callable[[AsyncEngine], FastAPI] = native_app) -> None:
        self.config = config
        self.make_app = make_app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: AsyncEngine | None = None
        self._server: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="loopback-server", daemon=True)

    def start(self, timeout: float = 300.0) -> LoopbackServer:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the test server did not start: {self._error!r}")
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        import uvicorn

        async with AsyncEngine(self.config) as engine:
            self.engine = engine
            self.loop = asyncio.get_running_loop()
            cfg = uvicorn.Config(self.make_app(engine), log_level="warning", lifespan="off")
            self._server = uvicorn.Server(cfg)
            serving = asyncio.ensure_future(self._server.serve(sockets=[self.sock]))
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.01)
            self._ready.set()
            await serving

    def call(self, fn: Callable[[AsyncEngine], Coroutine[Any, Any, Any]], timeout: float = 60.0) -> Any:
        assert self.loop is not None and self.engine is not None
        return asyncio.run_coroutine_threadsafe(fn(self.engine), self.loop).result(timeout)

    def check_integrity(self) -> None:
        """Every KV slot free or cached once all requests are done (waits for aborts to land)."""

        async def check(engine: AsyncEngine) -> None:
            for _ in range(200):
                stats = await engine.stats()
                if stats["running"] == 0 and stats["waiting"] == 0:
                    break
                await asyncio.sleep(0.05)
            await engine.check_integrity()

        self.call(check)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(60)
        self.sock.close()
