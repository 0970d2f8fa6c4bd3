"""The default backend (`set_default_backend`) and turning engines into backends."""

from __future__ import annotations

import threading
from typing import Any

from radixserve.lang.backend import Backend

_default: Backend | None = None
_lock = threading.Lock()
DEFAULT_MODEL = "smollm2-135m-instruct"


def as_backend(x: Any) -> Backend:
    if isinstance(x, Backend):
        return x
    from radixserve.lang.engine_backend import EngineBackend

    return EngineBackend(x)


def set_default_backend(backend: Any) -> None:
    """The backend programs use when run() is given none: a Backend, AsyncEngine or Engine."""
    global _default
    with _lock:
        _default = None if backend is None else as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default


def resolve_backend(backend: Any = None) -> Backend:
    """The given backend, else the default one, else the embedded model (started once)."""
    global _default
    if backend is not None:
        return as_backend(backend)
    with _lock:
        if _default is None:
            from radixserve.blocking import Engine
            from radixserve.lang.engine_backend import EngineBackend

            _default = EngineBackend(Engine(model=DEFAULT_MODEL), owned=True)
        return _default
