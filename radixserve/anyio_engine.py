"""`AnyioEngine`: the engine for any anyio event loop (asyncio, uvloop, trio).

`AsyncEngine` is asyncio-native: it lives in the caller's asyncio (or uvloop)
loop, which is also what anyio's asyncio backend runs. A trio program cannot
host it, so `AnyioEngine` runs an `AsyncEngine` on an asyncio loop of its own
(a daemon thread) and hands each output to the caller's loop as it comes:

    async with AnyioEngine(EngineConfig()) as engine:      # under trio.run or anyio.run
        async for out in engine.generate("Hello", SamplingParams(max_tokens=8)):
            print(out.delta_text, end="")

Same methods as `AsyncEngine`; cancelling the caller (a trio cancel scope, an
asyncio cancel) or leaving the `async for` aborts the request there. One
extra hop per output between the two loops is the price.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from radixserve.event_loops import new_event_loop

if TYPE_CHECKING:
    from radixserve.config import EngineConfig
    from radixserve.engine import AsyncEngine, Prompt
    from radixserve.outputs import RequestOutput
    from radixserve.sampling_params import SamplingParams

T = TypeVar("T")
_END = object()


def _soon_in_caller() -> Callable[..., object]:
    """A thread-safe "call this soon" into the running loop, whichever library runs it."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: anyio's other backend
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon


class _Mailbox:
    """Items posted into the caller's loop, awaited one by one (single consumer)."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.event: anyio.Event | None = None

    def put(self, item: Any) -> None:  # in the caller's loop
        self.items.append(item)
        if self.event is not None:
            self.event.set()

    async def get(self) -> Any:
        while not self.items:
            self.event = anyio.Event()
            await self.event.wait()
            self.event = None
        return self.items.popleft()


class AnyioEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        from radixserve.engine import AsyncEngine

        self.engine: AsyncEngine = AsyncEngine(config, **overrides)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> AnyioEngine:
        if self._loop is None:
            await anyio.to_thread.run_sync(self._start_blocking)
        return self

    def _start_blocking(self) -> None:
        loop = new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="radixserve-loop", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.engine.start(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join()
            loop.close()
            raise
        self._loop = loop

    async def shutdown(self, drain: bool = True) -> None:
        if self._loop is None:
            return
        await self._run(lambda: self.engine.shutdown(drain))
        loop, self._loop = self._loop, None
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        await anyio.to_thread.run_sync(self._thread.join)
        loop.close()

    async def __aenter__(self) -> AnyioEngine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown(drain=exc[0] is None)

    @property
    def healthy(self) -> bool:
        return self._loop is not None and self.engine.healthy

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    # ---- requests ------------------------------------------------------------------------

    async def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, **kw: Any
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs like `AsyncEngine.generate`; leaving early aborts the request."""
        loop = self._require_loop()
        soon = _soon_in_caller()
        box = _Mailbox()

        async def pump() -> None:  # in the engine's loop
            try:
                async for out in self.engine.generate(prompt, params, **kw):
                    soon(box.put, out)
                soon(box.put, _END)
            except BaseException as e:  # cancelled by the caller, or the engine's error
                soon(box.put, e)
                if isinstance(e, asyncio.CancelledError):
                    raise

        fut = asyncio.run_coroutine_threadsafe(pump(), loop)
        try:
            while (item := await box.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not fut.done():
                fut.cancel()  # closes the engine's generator: the request is aborted

    async def complete(self, prompt: Prompt, params: SamplingParams | None = None, **kw: Any) -> Any:
        return await self._run(lambda: self.engine.complete(prompt, params, **kw))

    async def generate_many(self, prompts: Any, params: Any = None, **kw: Any) -> Any:
        return await self._run(lambda: self.engine.generate_many(prompts, params, **kw))

    async def abort(self, request_id: str) -> None:
        await self._run(lambda: self.engine.abort(request_id))

    async def flush_cache(self) -> bool:
        return await self._run(self.engine.flush_cache)

    async def check_integrity(self) -> None:
        await self._run(self.engine.check_integrity)

    async def stats(self) -> dict[str, Any]:
        return await self._run(self.engine.stats)

    # ---- internals -----------------------------------------------------------------------

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError(
                "the engine is not running: use `async with engine:` or `await engine.start()`"
            )
        return self._loop

    async def _run(self, coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Await `coro_fn()` on the engine's loop; cancelling the caller cancels it there."""
        loop = self._require_loop()
        soon = _soon_in_caller()
        done = anyio.Event()
        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro_fn(), loop)
        fut.add_done_callback(lambda _: soon(done.set))
        try:
            await done.wait()
        finally:
            if not fut.done():
                fut.cancel()
        return fut.result()
