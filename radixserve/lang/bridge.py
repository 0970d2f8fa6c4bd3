"""Which event loop a program runs on, and how plain or async code reaches it.

An engine belongs to the loop it started in, so a program's tasks run there:
`arun` in that loop awaits the engine directly; from another running loop it
hops with `run_coroutine_threadsafe`; `run` from plain code waits on the
engine's loop, or, for a backend bound to no loop (or an engine not started),
on one background loop of this module's own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from radixserve.lang.backend import Backend

T = TypeVar("T")
_bg: asyncio.AbstractEventLoop | None = None
_bg_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    global _bg
    with _bg_lock:
        if _bg is None or not _bg.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()
            loop.call_soon(started.set)
            threading.Thread(target=loop.run_forever, name="radixserve-lang", daemon=True).start()
            started.wait()
            _bg = loop
        return _bg


def on_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def loop_for_sync(backend: Backend) -> asyncio.AbstractEventLoop:
    """The loop that `run()` (plain code, no running loop here) drives `backend` on."""
    loop = backend.loop
    if loop is None:
        return background_loop()
    if on_thread_of(loop):
        raise RuntimeError("fn.run() was called inside the engine's event loop: use `await fn.arun(...)`")
    if not loop.is_running():
        raise RuntimeError(
            "the engine's event loop is not running (the engine outlived the loop it started in)"
        )
    return loop


def call_sync(loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[T]]) -> T:
    fut = asyncio.run_coroutine_threadsafe(_call(fn), loop)
    try:
        return fut.result()
    except BaseException:
        fut.cancel()
        raise


async def _call(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


async def loop_for_async(backend: Backend) -> asyncio.AbstractEventLoop:
    """The loop an `arun()` in the current loop drives `backend` on (started there if free)."""
    loop = backend.loop
    if loop is None:
        return asyncio.get_running_loop()
    if not loop.is_running():
        raise RuntimeError(
            "the engine's event loop is not running (the engine outlived the loop it started in)"
        )
    return loop


async def call_async(loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[T]]) -> T:
    """Await `fn()` on `loop`: directly when it is the running loop, else by a hop."""
    if on_thread_of(loop):
        return await fn()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_call(fn), loop))
