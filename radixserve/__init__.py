"""radixserve: an asyncio-native LLM inference engine.

One `AsyncEngine` in the caller's event loop, a worker thread that overlaps
scheduling with the forward pass, and a radix tree that reuses the KV cache of
shared prefixes. `Engine` is the blocking facade.
"""

from radixserve.config import EngineConfig
from radixserve.engine import AsyncEngine, Engine, EngineDeadError
from radixserve.outputs import RequestOutput, TokenLogprob, Usage
from radixserve.sampling_params import SamplingParams

__all__ = [
    "AsyncEngine",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
]
__version__ = "0.1.0"
