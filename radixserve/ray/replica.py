"""`EngineReplica`: one Ray Serve replica, an `AsyncEngine` in the replica's event loop.

The ingress (`ingress.py`) prepares each request (chat template, tools, token
ids) and calls `generate` / `complete` with token ids; the request router
(`router.py`) picks the replica by prefix affinity. Maintenance calls (`abort`,
`stats`, `flush_cache`, `check_integrity`) reach every replica through the
handle's `broadcast`. A replica whose engine failed fails Ray Serve's health
check, and Ray Serve replaces it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from radixserve.config import EngineConfig
from radixserve.engine import AsyncEngine
from radixserve.outputs import RequestOutput
from radixserve.ray.deltas import as_delta
from radixserve.sampling_params import SamplingParams

# Files of a model folder that are not its tokenizer's (weights, and what only weights need).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
_MAX_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class ReplicaInfo:
    """What the ingress needs to prepare requests as a replica would."""

    context_length: int
    vocab_size: int
    # The tokenizer's files (tokenizer.json, its config, the chat template), so the ingress
    # loads the very same tokenizer on any machine; empty for a model without one.
    tokenizer_files: dict[str, bytes]


class EngineReplica:
    async def __init__(self, config: EngineConfig) -> None:  # type: ignore[misc]  # Ray Serve awaits it
        self.engine = AsyncEngine(config)
        await self.engine.start()
        self._kv_tokens = int((await self.engine.stats())["total_slots"])

    def record_replica_metadata(self) -> dict[str, int]:
        """Read once by Ray Serve and handed to the request router: the KV pool, which bounds
        the router's prefix index of this replica."""
        return {"kv_tokens": self._kv_tokens}

    def check_health(self) -> None:
        if not self.engine.healthy:
            raise RuntimeError("the engine of this replica is not healthy")

    async def generate(
        self, *, ids: list[int], params: SamplingParams, request_id: str | None, extra_key: str | None
    ) -> AsyncIterator[RequestOutput]:
        async for out in self.engine.generate(ids, params, request_id=request_id, extra_key=extra_key):
            yield as_delta(out)  # the ingress joins the deltas (ray/deltas.py)

    async def complete(
        self, *, ids: list[int], params: SamplingParams, request_id: str | None, extra_key: str | None
    ) -> RequestOutput | list[RequestOutput]:
        return await self.engine.complete(ids, params, request_id=request_id, extra_key=extra_key)

    async def info(self) -> ReplicaInfo:
        loaded = self.engine.loaded
        assert loaded is not None
        files: dict[str, bytes] = {}
        if loaded.tokenizer is not None and loaded.path is not None:
            for f in sorted(Path(loaded.path).iterdir()):
                small = f.is_file() and f.stat().st_size <= _MAX_FILE_BYTES
                if small and not f.name.endswith(_WEIGHT_SUFFIXES):
                    files[f.name] = f.read_bytes()
        return ReplicaInfo(self.engine.context_length, loaded.config.vocab_size, files)

    # Maintenance, broadcast to every replica by the ingress.

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def stats(self) -> dict[str, int | float]:
        return await self.engine.stats()

    async def flush_cache(self) -> bool:
        return await self.engine.flush_cache()

    async def check_integrity(self) -> None:
        await self.engine.check_integrity()

    async def __del__(self) -> None:
        await self.engine.shutdown(drain=False)
