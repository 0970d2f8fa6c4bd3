"""`AsyncEngine`: the object most users touch (`Engine`, in blocking.py, wraps it).

Design: `AsyncEngine` is the public API (its signatures, docstrings and
lifecycle) and hands every call to one *core*, an object of the `EngineCore`
protocol below, chosen once when it is made: a `LocalEngine` (local_engine.py:
one model, KV pool and worker thread), or, with `data_parallel_size`, a
`ReplicaSet` (replicas/replica_set.py: N engines of this class behind a
router); radixserve.ray's ingress makes one over Ray Serve's replicas
(`AsyncEngine.over`). So the API is written once, each core holds only its own
path, and nothing here asks which core it has.

An engine lives in the caller's asyncio event loop and belongs to the loop it
was started in (`engine.loop`); calls from another loop raise `RuntimeError`
at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any, Protocol

from radixserve.cache.kv_pool import KVPool
from radixserve.chat_plan import ChatOptions, ChatParsers
from radixserve.config import EngineConfig
from radixserve.constrained.cache import GrammarCache
from radixserve.local_engine import LocalEngine
from radixserve.model.loader import LoadedModel
from radixserve.outputs import RequestOutput
from radixserve.prompts import JsonObject, Prompt
from radixserve.replicas.replica_set import ReplicaSet
from radixserve.sampling_params import SamplingParams
from radixserve.sched.scheduler import Scheduler
from radixserve.sched.worker import Worker
from radixserve.submission import complete_many


class EngineCore(Protocol):
    """What an `AsyncEngine` hands its calls to; each member is the `AsyncEngine` one of the
    same name, with the chat options as one `ChatOptions`."""

    @property
    def config(self) -> EngineConfig: ...
    @property
    def loaded(self) -> LoadedModel | None: ...
    @property
    def context_length(self) -> int: ...
    # One engine's parts, for tools that reach into it (None for a core of replicas).
    @property
    def scheduler(self) -> Scheduler | None: ...
    @property
    def pool(self) -> KVPool | None: ...
    @property
    def worker(self) -> Worker | None: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def chat_parsers(self) -> ChatParsers | None: ...
    @property
    def tokenizer(self) -> Any: ...  # transformers' tokenizer (untyped) or TextTokenizer
    @property
    def grammar_cache(self) -> GrammarCache | None: ...

    async def start(self) -> None: ...
    async def shutdown(self, drain: bool = ...) -> None: ...
    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> AsyncGenerator[RequestOutput, None]: ...
    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> RequestOutput | list[RequestOutput]: ...
    async def abort(self, request_id: str) -> None: ...
    async def flush_cache(self) -> bool: ...
    async def check_integrity(self) -> None: ...
    async def stats(self) -> dict[str, int | float]: ...
    def check_alive(self) -> None: ...


class AsyncEngine:
    config: EngineConfig
    replicas: tuple[AsyncEngine, ...]
    """The engines of each replica with `data_parallel_size` (none without)."""

    # overrides: EngineConfig's fields, each of its own type (checked by EngineConfig itself)
    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        config = replace(config or EngineConfig(), **overrides) if overrides else (config or EngineConfig())
        if config.replicated:
            replica_set = ReplicaSet(config, AsyncEngine)
            self._bind(replica_set, replica_set.engines)
        else:
            self._bind(LocalEngine(config), ())

    @classmethod
    def over(cls, core: EngineCore) -> AsyncEngine:
        """An engine whose calls go to `core` (radixserve.ray's ingress: replicas on Ray Serve)."""
        engine = cls.__new__(cls)
        engine._bind(core, ())
        return engine

    def _bind(self, core: EngineCore, replicas: tuple[AsyncEngine, ...]) -> None:
        self._core = core
        self.config = core.config
        self.replicas = replicas

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> AsyncEngine:
        """Load the model and start the worker; concurrent calls share one start."""
        await self._core.start()
        return self

    async def shutdown(self, drain: bool = True) -> None:
        """Stop the worker; with `drain`, first let every submitted request finish.

        Without it, every request still pending ends at once: its `complete()` or
        `generate()` raises `EngineClosedError`. Later calls raise `RuntimeError`."""
        await self._core.shutdown(drain)

    async def __aenter__(self) -> AsyncEngine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown(drain=exc[0] is None)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this engine was started in (None before `start()`); it serves only that loop."""
        return self._core.loop

    @property
    def healthy(self) -> bool:
        """Whether it takes requests (with replicas: while one does; the others' state: `stats()`)."""
        return self._core.healthy

    @property
    def loaded(self) -> LoadedModel | None:
        """The model, tokenizer and config loaded (None before `start()` and after `shutdown()`)."""
        return self._core.loaded

    @property
    def context_length(self) -> int:
        return self._core.context_length

    @property
    def chat_parsers(self) -> ChatParsers | None:
        """The tool-call and reasoning formats of this model's chat outputs (None: no tokenizer)."""
        return self._core.chat_parsers

    @property
    def tokenizer(self) -> Any:  # transformers' tokenizer (untyped) or TextTokenizer, as loaded
        return self._core.tokenizer

    @property
    def grammar_cache(self) -> GrammarCache | None:
        """Compiled grammars (with replicas, replica 0's: each compiles and keeps its own)."""
        return self._core.grammar_cache

    @property
    def scheduler(self) -> Scheduler | None:
        return self._core.scheduler

    @property
    def pool(self) -> KVPool | None:
        return self._core.pool

    @property
    def _worker(self) -> Worker | None:
        """The worker thread's loop object, for tools that profile or hook it (benchmarks)."""
        return self._core.worker

    # ---- requests ------------------------------------------------------------------------

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        extra_key: str | None = None,
        tools: Sequence[JsonObject] | None = None,
        tool_choice: str | JsonObject | None = None,
        parallel_tool_calls: bool | None = None,
        chat_template_kwargs: JsonObject | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream outputs of one request (n completions interleaved, told apart by `index`).

        With chat messages, `tools` / `tool_choice` / `parallel_tool_calls` are OpenAI's and
        `chat_template_kwargs` go to the chat template; outputs then carry `tool_calls` (and
        `delta_tool_calls`), and `reasoning_text` for a reasoning model (radixserve/chat_plan.py).

        The request is aborted (and its KV freed) when the generator is closed
        before the end: at once when the task is cancelled, on `await gen.aclose()`
        or at the end of `async with contextlib.aclosing(engine.generate(...))`;
        after a plain `break`, when the generator is garbage-collected (in CPython
        right away, unless the caller still holds a reference to it). Nothing runs before the
        first `__anext__`: errors in the request raise there.
        """
        options = ChatOptions(tools, tool_choice, parallel_tool_calls, chat_template_kwargs)
        # The core's generator itself: no hop per output.
        return self._core.generate(
            prompt, params, request_id=request_id, extra_key=extra_key, options=options
        )

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        extra_key: str | None = None,
        tools: Sequence[JsonObject] | None = None,
        tool_choice: str | JsonObject | None = None,
        parallel_tool_calls: bool | None = None,
        chat_template_kwargs: JsonObject | None = None,
    ) -> RequestOutput | list[RequestOutput]:
        """The final output (a list of n outputs, by index, when `params.n > 1`); the chat
        options are `generate`'s.

        Unlike `generate`, nothing wakes the caller before the end: under many
        concurrent requests the event loop stays quiet and the worker keeps the GIL.
        """
        options = ChatOptions(tools, tool_choice, parallel_tool_calls, chat_template_kwargs)
        return await self._core.complete(
            prompt, params, request_id=request_id, extra_key=extra_key, options=options
        )

    async def generate_many(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        progress: bool = False,
    ) -> list[RequestOutput | list[RequestOutput]]:
        """Run many requests concurrently; results in prompt order."""
        self._core.check_alive()
        return await complete_many(self.complete, prompts, params, progress)

    async def abort(self, request_id: str) -> None:
        """Abort the live request `request_id` (nothing if there is none)."""
        await self._core.abort(request_id)

    # ---- maintenance (run on the worker thread, between steps) ---------------------------

    async def flush_cache(self) -> bool:
        """Empty the radix cache; False (nothing done) while requests are running."""
        return await self._core.flush_cache()

    async def check_integrity(self) -> None:
        """Assert every KV slot is free, in the radix tree, or owned by a running request."""
        await self._core.check_integrity()

    async def stats(self) -> dict[str, int | float]:
        """The scheduler's and the worker's counters (sched/stats.py) and the watchdog's stalls;
        with replicas, theirs summed and the router's (replicas/stats.py)."""
        return await self._core.stats()
