"""What a caller of a dead or closed engine gets (importing this loads nothing heavy)."""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The worker thread failed (or its event loop closed); the engine takes no more requests."""


class EngineStalledError(EngineDeadError):
    """The worker made no progress for `EngineConfig.watchdog_timeout_s` with work to do.

    Pending requests fail with it and new ones are refused while the stall lasts; the engine
    serves again if the worker's step ends after all (`radixserve/watchdog.py`)."""


class EngineClosedError(EngineDeadError):
    """The engine was shut down (`shutdown(drain=False)`, `Engine.close()`) before the request ended."""


WRONG_LOOP = (
    "this AsyncEngine belongs to the event loop it was started in (engine.loop), and this call "
    "runs in another one; use the blocking radixserve.Engine from other threads, or submit the "
    "coroutine to the engine's loop: asyncio.run_coroutine_threadsafe(coro, engine.loop)"
)
