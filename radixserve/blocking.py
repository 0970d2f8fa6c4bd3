"""`Engine`: the blocking facade over `AsyncEngine`, for scripts and notebooks.

It runs its own event loop on a background thread and waits on it, so callers
without asyncio get the same methods (`generate` is a plain iterator).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from radixserve.config import EngineConfig
from radixserve.engine import AsyncEngine, Prompt
from radixserve.outputs import RequestOutput
from radixserve.sampling_params import SamplingParams


class Engine:
    """Blocking facade over `AsyncEngine` (see the module docstring)."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="radixserve-loop", daemon=True)
        self._thread.start()
        self.engine = AsyncEngine(config, **overrides)
        try:
            self.run(self.engine.start())
        except BaseException:
            self._stop_loop()  # a model that fails to load leaves no thread behind
            raise

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the engine's event loop and wait for it (e.g. a body
        that uses `self.engine`, the AsyncEngine, directly)."""
        if self._closed or not self._loop.is_running():
            if asyncio.iscoroutine(coro):
                coro.close()  # never awaited: no "was never awaited" warning
            raise RuntimeError("this Engine is closed")
        if threading.current_thread() is self._thread:
            if asyncio.iscoroutine(coro):
                coro.close()
            # Waiting here would block the very loop that has to do the work.
            raise RuntimeError(
                "a blocking Engine method was called from the engine's own event loop: "
                "await engine.engine.<method>(...) there"
            )
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # Ctrl-C here cancels the coroutine too (and so aborts its request)
            raise

    _run = run

    def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, **kw: Any
    ) -> Iterator[RequestOutput]:
        agen = self.engine.generate(prompt, params, **kw)
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            # RuntimeError: still unwinding from a cancelled step, whose cleanup aborts the request.
            with contextlib.suppress(RuntimeError):
                self.run(agen.aclose())  # type: ignore[attr-defined]

    def complete(self, prompt: Prompt, params: SamplingParams | None = None, **kw: Any) -> Any:
        return self._run(self.engine.complete(prompt, params, **kw))

    def generate_many(
        self, prompts: Sequence[Prompt], params: Any = None, progress: bool = False
    ) -> list[Any]:
        return self._run(self.engine.generate_many(prompts, params, progress=progress))

    def flush_cache(self) -> bool:
        return bool(self._run(self.engine.flush_cache()))

    def check_integrity(self) -> None:
        self._run(self.engine.check_integrity())

    def stats(self) -> dict[str, Any]:
        return dict(self._run(self.engine.stats()))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def healthy(self) -> bool:
        return self.engine.healthy

    def close(self) -> None:
        """Shut down: every call still waiting (on other threads) raises, and so does every later one."""
        if self._closed:
            return
        try:
            if self._loop.is_running():
                self.run(self.engine.shutdown(drain=False))
        finally:
            self._closed = True
            if self._loop.is_running():
                self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
