"""radixserve: an asyncio-native LLM inference engine.

One `AsyncEngine` in the caller's event loop, a worker thread that overlaps
scheduling with the forward pass, and a radix tree that reuses the KV cache of
shared prefixes. `Engine` is the blocking facade.

The names below are imported on first use, so `import radixserve` (the CLI's
`--help`, the pytest plugin in sessions that never ask for an engine) does not
pay for torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from radixserve.version import __version__ as __version__

_EXPORTS = {
    "AnyioEngine": "radixserve.anyio_engine",
    "AsyncEngine": "radixserve.engine",
    "Engine": "radixserve.blocking",
    "EngineDeadError": "radixserve.errors",
    "EngineClosedError": "radixserve.errors",
    "EngineStalledError": "radixserve.errors",
    "EngineConfig": "radixserve.config",
    "RequestOutput": "radixserve.outputs",
    "TokenLogprob": "radixserve.outputs",
    "Usage": "radixserve.outputs",
    "SamplingParams": "radixserve.sampling_params",
}

__all__ = [
    "AnyioEngine",
    "AsyncEngine",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineDeadError",
    "EngineStalledError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
]

if TYPE_CHECKING:
    from radixserve.anyio_engine import AnyioEngine
    from radixserve.blocking import Engine
    from radixserve.config import EngineConfig
    from radixserve.engine import AsyncEngine
    from radixserve.errors import EngineClosedError, EngineDeadError, EngineStalledError
    from radixserve.outputs import RequestOutput, TokenLogprob, Usage
    from radixserve.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'radixserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
