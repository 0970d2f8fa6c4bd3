"""`ReplicaSet`: N engines (replicas) behind one engine's API and a router.

`AsyncEngine(EngineConfig(data_parallel_size=N))` hands every call to one (its
core, engine.py's `EngineCore`), so the server, the blocking `Engine` and every
other caller take it as they take one engine. Each replica is a full engine (made by the factory the
engine passes in: this layer sits below engine.py) in the same event loop, on
its own device, with its own worker thread, KV pool and radix cache.

A request is prepared once here, as one engine would (chat template, tools,
tokenizing), routed on its token ids (`Router`), and run by its replica as
token ids; its outputs pass through unchanged (chat outputs parsed here). The
router learns from the result: the replica's cache now holds the prompt and
output, and a cached count below what the router expected means the replica
evicted (`PrefixIndex.forget_evicted`).

`abort` reaches the replica that holds the request; `flush_cache`,
`check_integrity` and `stats` cover every live replica. A replica that fails
fails only its own requests: it is reported unhealthy (`stats()`,
`replica<i>_healthy`), takes no more requests, and the engine stays `healthy`
while one replica is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any, Generic, TypeVar

from radixserve.chat_output import ChatRewriter
from radixserve.chat_plan import ChatOptions, ChatParsers
from radixserve.config import EngineConfig
from radixserve.constrained.cache import GrammarCache
from radixserve.errors import WRONG_LOOP, EngineDeadError
from radixserve.model.loader import LoadedModel
from radixserve.outputs import RequestOutput
from radixserve.prompts import Prompt
from radixserve.replicas.devices import replica_configs
from radixserve.replicas.prepare import check_ids, prepare_request, rewrite_result
from radixserve.replicas.replica import Replica
from radixserve.replicas.router import Placement, Router
from radixserve.replicas.stats import merge_stats
from radixserve.sampling_params import SamplingParams

E = TypeVar("E", bound=Replica)


class ReplicaSet(Generic[E]):
    """Replicas behind one engine's API (see the module docstring); `make` builds one engine
    from its config (engine.py passes `AsyncEngine`)."""

    # One engine's parts (`EngineCore`'s): each replica has its own, in `engines`.
    scheduler: None = None
    pool: None = None
    worker: None = None

    def __init__(self, config: EngineConfig, make: Callable[[EngineConfig], E]) -> None:
        self.config = config
        self.engines: tuple[E, ...] = tuple(make(c) for c in replica_configs(config))
        self.router: Router | None = None  # made at start, when the replicas' pool sizes are known
        self._owner: dict[str, int] = {}  # live request id -> its replica
        self._down: set[int] = set()  # replicas seen unhealthy (their index forgotten)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_task: asyncio.Task[None] | None = None
        self.loaded: LoadedModel | None = None  # replica 0's (every replica loads the same model)
        self.context_length = 0

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start every replica (their models load one at a time, their workers run at once)."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop and (self.router or self._start_task):
            raise RuntimeError(WRONG_LOOP)
        if self.router is not None and self._start_task is None:
            return
        if self._start_task is None:
            self._loop = loop
            self._start_task = loop.create_task(self._start())
        await asyncio.shield(self._start_task)

    async def _start(self) -> None:
        try:
            got = await asyncio.gather(*(r.start() for r in self.engines), return_exceptions=True)
            failed = [e for e in got if isinstance(e, BaseException)]
            if failed:
                stops = (r.shutdown(drain=False) for r in self.engines)
                await asyncio.gather(*stops, return_exceptions=True)
                self._loop = None
                raise failed[0]
            sizes = [int((await r.stats())["total_slots"]) for r in self.engines]
            first = self.engines[0]
            self.loaded = first.loaded
            self.context_length = min(r.context_length for r in self.engines)
            self._owner.clear()
            self._down.clear()
            self.router = Router(self.config.router, sizes, self.config.page_size)
        finally:
            self._start_task = None

    async def shutdown(self, drain: bool = True) -> None:
        """Shut every replica down (`AsyncEngine.shutdown`: with `drain`, after its requests)."""
        if self._start_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._start_task)
        if self.router is None:
            return
        assert self._loop is not None
        if asyncio.get_running_loop() is not self._loop and not self._loop.is_closed():
            raise RuntimeError(WRONG_LOOP)
        got = await asyncio.gather(*(r.shutdown(drain) for r in self.engines), return_exceptions=True)
        self.router = None
        self.loaded = None
        failed = [e for e in got if isinstance(e, BaseException)]
        if failed:
            raise failed[0]

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def healthy(self) -> bool:
        """While one replica is healthy (the others' state: `stats()`'s `replica<i>_healthy`)."""
        return self.router is not None and any(r.healthy for r in self.engines)

    @property
    def chat_parsers(self) -> ChatParsers | None:
        return self.engines[0].chat_parsers

    @property
    def tokenizer(self) -> Any:  # as AsyncEngine.tokenizer: every replica loads the same one
        return self.engines[0].tokenizer

    @property
    def grammar_cache(self) -> GrammarCache | None:
        """Replica 0's (each replica compiles and keeps its own)."""
        return self.engines[0].grammar_cache

    # ---- requests ------------------------------------------------------------------------

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> AsyncGenerator[RequestOutput, None]:
        """`AsyncEngine.generate`, on the replica the router picks."""
        ids, params, rewrite = self._prepare(prompt, params or SamplingParams(), options)
        router, place = self._place(ids, params, request_id, extra_key)
        final: RequestOutput | None = None
        try:
            replica = self.engines[place.replica]
            outs = replica.generate(ids, params, request_id=request_id, extra_key=extra_key)
            # Closed at once when this generator is (a cancel, a break): the replica aborts it.
            async with contextlib.aclosing(outs):  # type: ignore[type-var]  # an async generator
                async for out in outs:
                    if out.finished and out.index == 0:
                        final = out
                    yield out if rewrite is None else rewrite(out)
        finally:
            self._release(router, place, request_id, ids, params, final)

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> RequestOutput | list[RequestOutput]:
        """`AsyncEngine.complete`, on the replica the router picks."""
        ids, params, rewrite = self._prepare(prompt, params or SamplingParams(), options)
        router, place = self._place(ids, params, request_id, extra_key)
        result: RequestOutput | list[RequestOutput] | None = None
        try:
            replica = self.engines[place.replica]
            result = await replica.complete(ids, params, request_id=request_id, extra_key=extra_key)
        finally:
            final = result[0] if isinstance(result, list) else result
            self._release(router, place, request_id, ids, params, final)
        return rewrite_result(rewrite, result)

    async def abort(self, request_id: str) -> None:
        """Abort the live request `request_id` on its replica (nothing if there is none)."""
        self.check_loop()
        replica = self._owner.get(request_id)
        if replica is not None:
            await self.engines[replica].abort(request_id)

    # ---- maintenance ---------------------------------------------------------------------

    async def flush_cache(self) -> bool:
        """Empty every live replica's radix cache; False if one had requests running (that one
        keeps its cache)."""
        live = self._live_indexes()
        done = await asyncio.gather(*(self.engines[i].flush_cache() for i in live))
        router = self.router
        for i, flushed in zip(live, done):
            if flushed and router is not None:
                router.forget(i)
        return all(done)

    async def check_integrity(self) -> None:
        """`AsyncEngine.check_integrity` on every live replica (a failed one holds nothing to check)."""
        await asyncio.gather(*(self.engines[i].check_integrity() for i in self._live_indexes()))

    async def stats(self) -> dict[str, int | float]:
        """The live replicas' counters summed, the router's (`router_...`) and each replica's
        health and load (`replica<i>_...`): `replicas/stats.py`."""
        live = self._live_indexes()
        got = await asyncio.gather(*(self.engines[i].stats() for i in live), return_exceptions=True)
        per: list[dict[str, int | float] | None] = [None] * len(self.engines)
        for i, stats in zip(live, got):
            if not isinstance(stats, BaseException):
                per[i] = stats
        assert self.router is not None
        return merge_stats(per, self.router)

    # ---- internals -----------------------------------------------------------------------

    def _prepare(
        self, prompt: Prompt, params: SamplingParams, options: ChatOptions
    ) -> tuple[list[int], SamplingParams, ChatRewriter | None]:
        self.check_alive()
        assert self.loaded is not None
        vocab = self.loaded.config.vocab_size
        return prepare_request(
            self.tokenizer, self.chat_parsers, self.context_length, vocab, prompt, params, options
        )

    def _place(
        self, ids: list[int], params: SamplingParams, request_id: str | None, extra_key: str | None
    ) -> tuple[Router, Placement]:
        check_ids(request_id, extra_key, self._owner)
        router = self.router
        assert router is not None
        live = [r.healthy for r in self.engines]
        for i, ok in enumerate(live):
            if ok:
                self._down.discard(i)
            elif i not in self._down:  # a replica that failed or stalls: its cache is no guide
                self._down.add(i)
                router.forget(i)
        place = router.route(ids, extra_key, params.n, live)
        if request_id is not None:
            self._owner[request_id] = place.replica
        return router, place

    def _release(
        self,
        router: Router,
        place: Placement,
        request_id: str | None,
        ids: list[int],
        params: SamplingParams,
        final: RequestOutput | None,
    ) -> None:
        if request_id is not None:
            self._owner.pop(request_id, None)
        if final is None or final.finish_reason in (None, "abort"):
            router.finished(place, None, None)
            return
        # The replica caches the prompt and every output token but the last (never computed).
        tokens = ids + list(final.token_ids[:-1])
        # A request with prompt logprobs matches less of its prompt than is cached.
        cached = None if params.prompt_logprobs else final.usage.cached_tokens
        router.finished(place, tokens, cached)

    def _live_indexes(self) -> list[int]:
        self.check_alive()
        return [i for i, r in enumerate(self.engines) if r.healthy]

    def check_loop(self) -> None:
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(WRONG_LOOP)

    def check_alive(self) -> None:
        self.check_loop()
        if self.router is None:
            raise RuntimeError(
                "the engine is not running: use `async with engine:` or `await engine.start()`"
            )
        if not any(r.healthy for r in self.engines):
            raise EngineDeadError("every replica of this engine has failed")
