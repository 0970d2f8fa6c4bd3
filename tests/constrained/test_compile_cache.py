"""`GrammarCache` on its `CompileExecutor`: timeouts, abandoned compiles, close(), byte bound.

A stand-in backend makes compiles slow on demand (they block on an event, as a compile
that takes minutes would); the byte bound is also checked with xgrammar's own sizes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from radixserve import SamplingParams
from radixserve.constrained.cache import GrammarCache
from radixserve.constrained.spec import GrammarSpec
from radixserve.constrained.xgrammar_backend import XGrammarBackend

pytestmark = pytest.mark.timeout(60)


class SlowBackend:
    """Specs named "slow..." block until `release` is set; "size:N" weighs N bytes."""

    vocab_size = 8

    def __init__(self) -> None:
        self.release = threading.Event()
        self.compiled: list[str] = []

    def compile(self, spec: GrammarSpec) -> str:
        if spec.text.startswith("slow"):
            self.release.wait(30)
        if spec.text.startswith("bad"):
            raise ValueError(f"{spec.kind}: bad grammar")
        self.compiled.append(spec.text)
        return f"compiled {spec.text}"

    def memory_bytes(self, compiled: Any) -> int:
        text = str(compiled)
        return int(text.split(":")[1].split()[0]) if ":" in text else 1

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def allocate_bitmask(self, rows: int) -> Any:
        raise NotImplementedError

    def fill_bitmasks(self, matchers: Any, bitmask: Any, rows: Any) -> None:
        raise NotImplementedError


def spec(text: str) -> GrammarSpec:
    return GrammarSpec("regex", text)


async def until(cond: Any, bound_s: float = 10.0) -> None:
    deadline = time.monotonic() + bound_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_timeouts_abandon_compiles_and_the_cap_refuses_new_ones() -> None:
    backend = SlowBackend()
    cache = GrammarCache(backend, timeout_s=0.1, workers=1, max_abandoned=2)  # type: ignore[arg-type]

    async def body() -> None:
        with pytest.raises(ValueError, match="did not compile within 0.1 s"):
            await cache.get(spec("slow-1"))
        assert cache.abandoned == 1
        # The only worker is free again: a quick compile is not starved by the slow one.
        assert await asyncio.wait_for(cache.get(spec("quick")), 5) == "compiled quick"
        with pytest.raises(ValueError, match="did not compile"):  # the same slow one: at once
            await asyncio.wait_for(cache.get(spec("slow-1")), 0.05)
        with pytest.raises(ValueError, match="did not compile"):
            await cache.get(spec("slow-2"))
        assert cache.abandoned == 2
        with pytest.raises(ValueError, match="regex: 2 grammar compiles .* refused until one ends"):
            await cache.get(spec("other"))
        assert await cache.get(spec("quick")) == "compiled quick"  # cached ones still serve
        backend.release.set()
        await until(lambda: cache.abandoned == 0)
        assert await cache.get(spec("slow-1")) == "compiled slow-1"  # its result landed
        assert await cache.get(spec("other")) == "compiled other"  # refusals ended with it
        for _ in range(2):  # failures are kept: the second comes from the cache
            with pytest.raises(ValueError, match="bad grammar"):
                await cache.get(spec("bad"))

    asyncio.run(body())
    assert backend.compiled.count("quick") == 1 and backend.compiled.count("bad") == 0


def test_close_never_waits_and_refuses_new_compiles() -> None:
    backend = SlowBackend()
    cache = GrammarCache(backend, timeout_s=5, workers=1)  # type: ignore[arg-type]

    async def body() -> None:
        running = asyncio.ensure_future(cache.get(spec("slow-a")))
        queued = asyncio.ensure_future(cache.get(spec("queued")))  # behind it: one worker
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        cache.close()
        assert time.perf_counter() - t0 < 0.5
        with pytest.raises(ValueError, match="shutting down"):
            await queued  # dropped from the queue
        with pytest.raises(ValueError, match="shutting down"):
            await cache.get(spec("new"))
        backend.release.set()
        assert await running == "compiled slow-a"  # a running compile still delivers

    asyncio.run(body())
    assert "queued" not in backend.compiled


def test_cancelled_waiter_drops_a_queued_compile() -> None:
    backend = SlowBackend()
    cache = GrammarCache(backend, timeout_s=5, workers=1)  # type: ignore[arg-type]

    async def body() -> None:
        running = asyncio.ensure_future(cache.get(spec("slow-b")))
        queued = asyncio.ensure_future(cache.get(spec("never")))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        backend.release.set()
        await running
        assert await cache.get(spec("never")) == "compiled never"  # compiled anew on demand

    asyncio.run(body())
    assert backend.compiled == ["slow-b", "never"]


def test_byte_bound_evicts_least_recently_used() -> None:
    backend = SlowBackend()
    cache = GrammarCache(backend, max_bytes=100)  # type: ignore[arg-type]

    async def body() -> None:
        for name in ("size:40 a", "size:40 b"):
            await cache.get(spec(name))
        await cache.get(spec("size:40 a"))  # a is now the most recently used
        await cache.get(spec("size:40 c"))
        assert cache.bytes == 80 and cache.evictions == 1 and len(cache) == 2
        await cache.get(spec("size:40 a"))
        assert backend.compiled.count("size:40 a") == 1  # kept; b was evicted
        assert await cache.get(spec("size:500 huge")) == "compiled size:500 huge"  # served...
        assert cache.bytes <= 100 and spec("size:500 huge") not in cache._entries  # ...not kept

    asyncio.run(body())
    assert cache.compile_times.maxlen is not None


def test_byte_bound_with_xgrammar_sizes(tokenizer: Any) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = XGrammarBackend(tokenizer, len(tokenizer.get_vocab()), [eos])
    enums = [
        SamplingParams(json_schema={"enum": [f"{k}-value-{i}" for i in range(2000)]}).grammar for k in "ab"
    ]
    assert enums[0] is not None and enums[1] is not None
    one = backend.memory_bytes(backend.compile(enums[0]))
    assert one > 100_000  # a large enum holds real memory
    cache = GrammarCache(backend, max_bytes=one + one // 2)

    async def body() -> None:
        for s in enums:
            await cache.get(s)  # type: ignore[arg-type]

    asyncio.run(body())
    assert len(cache) == 1 and cache.evictions == 1 and 0 < cache.bytes <= cache.max_bytes
