"""`AsyncEngine`: the object most users touch (`Engine`, in blocking.py, wraps it).

The engine lives in the caller's asyncio event loop. Requests are tokenized
and validated there (a bad request raises in the caller and never reaches the
worker); the worker thread (`sched/worker.py`) schedules and runs the model;
its outputs come back once per step through `loop.call_soon_threadsafe` into
one sink per request (`sinks.py`), which `generate()` drains as an async
generator: one output per completion per step while the caller keeps up,
fewer and larger ones when it reads slower than the engine produces (the
worker builds no output for a completion whose previous one is unread).
Cancelling the task aborts the request, and so does closing the generator
(see `generate`).

An engine belongs to the event loop it was started in (`engine.loop`); calls
from another loop raise `RuntimeError` at once. What it runs on is built in
`engine_build.py`; the link between the caller's loop and the worker thread
(submitting, aborting, queries, failures) is `worker_link.py`, and routing outputs
to their callers `sinks.py`; compiling grammars for structured output is
`grammar_compiler.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any

from radixserve.cache.kv_pool import KVPool
from radixserve.chat_output import ChatRewriter
from radixserve.chat_plan import ChatOptions, ChatParsers, prepare_chat
from radixserve.config import EngineConfig
from radixserve.constrained.cache import GrammarCache
from radixserve.engine_build import build_parts
from radixserve.errors import WRONG_LOOP
from radixserve.grammar_compiler import GrammarCompiler, xgrammar_backend
from radixserve.model.loader import LoadedModel
from radixserve.outputs import RequestOutput
from radixserve.prompts import JsonObject, Prompt, is_chat
from radixserve.replicas.replica_set import ReplicaSet
from radixserve.sampling_params import SamplingParams
from radixserve.sched.messages import CheckIntegrity, FlushCache, ReadStats
from radixserve.sched.request import Request
from radixserve.sched.scheduler import Scheduler
from radixserve.sched.worker import Worker
from radixserve.sinks import Collector, Stream
from radixserve.submission import complete_many, make_requests
from radixserve.worker_link import WorkerLink


class AsyncEngine:
    # overrides: EngineConfig's fields, each of its own type (checked by EngineConfig itself)
    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        self.config = (
            replace(config or EngineConfig(), **overrides) if overrides else (config or EngineConfig())
        )
        self._link = WorkerLink()
        self._arrival = itertools.count()
        self._start_task: asyncio.Task[None] | None = None
        self._built: Worker | None = None  # the worker `_build` made, until `_start` runs it
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.pool: KVPool | None = None
        self.context_length = 0
        self._grammars = GrammarCompiler(self.config, lambda: xgrammar_backend(self.loaded))
        self._parsers: ChatParsers | None = None
        # Replicas (`data_parallel_size`): every call below goes to them (radixserve/replicas/),
        # and this engine builds nothing of its own.
        self._replicas = ReplicaSet(self.config, AsyncEngine) if self.config.replicated else None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> AsyncEngine:
        """Load the model and start the worker; concurrent calls share one start."""
        if self._replicas is not None:
            await self._replicas.start()
            self.loaded, self.context_length = self._replicas.loaded, self._replicas.context_length
            return self
        loop = asyncio.get_running_loop()
        link = self._link
        if link.loop is not None and loop is not link.loop and (link.worker or self._start_task):
            raise RuntimeError(WRONG_LOOP)
        if link.worker is not None and self._start_task is None:
            return self
        if self._start_task is None:
            link.loop = loop
            self._start_task = loop.create_task(self._start())
        # Shielded: one impatient caller's cancel must not leave a half-built engine behind.
        await asyncio.shield(self._start_task)
        return self

    async def _start(self) -> None:
        self._link.reset()
        try:
            await asyncio.to_thread(self._build)
        except BaseException:
            self._link.loop = None
            raise
        finally:
            self._start_task = None
        worker, self._built = self._built, None
        assert worker is not None
        self._link.run(worker, self.config.watchdog_timeout_s)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this engine was started in (None before `start()`); it serves only that loop."""
        if self._replicas is not None:
            return self._replicas.loop
        return self._link.loop

    @property
    def _worker(self) -> Worker | None:
        """The worker thread's loop object, for tools that profile or hook it (benchmarks)."""
        return self._link.worker

    def _build(self) -> None:
        parts = build_parts(self.config)
        self.loaded, self.pool, self.scheduler = parts.loaded, parts.pool, parts.scheduler
        if parts.loaded.tokenizer is not None:
            cfg, tok = self.config, parts.loaded.tokenizer
            self._parsers = ChatParsers.resolve(cfg.tool_call_parser, cfg.reasoning_parser, tok)
        self.context_length = parts.context_length
        self._built = Worker(
            parts.scheduler,
            parts.runner,
            self._link.post,
            self._link.fail,
            self.config.overlap_enabled,
            self._grammars.backend_now,
        )

    async def shutdown(self, drain: bool = True) -> None:
        """Stop the worker; with `drain`, first let every submitted request finish.

        Without it, every request still pending ends at once: its `complete()` or
        `generate()` raises `EngineClosedError`. Later calls raise `RuntimeError`."""
        if self._replicas is not None:
            await self._replicas.shutdown(drain)
            self.loaded = None
            return
        if self._start_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._start_task)
        if self._link.worker is None:
            return
        await self._link.stop(drain)
        self._grammars.close()  # compiles still running are not waited for
        # Drop the model, pool and graphs so their device memory can be reused.
        self.loaded = self.scheduler = self.pool = None

    async def __aenter__(self) -> AsyncEngine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown(drain=exc[0] is None)

    @property
    def healthy(self) -> bool:
        if self._replicas is not None:  # while one replica serves (the others: stats())
            return self._replicas.healthy
        return self._link.healthy

    @property
    def chat_parsers(self) -> ChatParsers | None:
        """The tool-call and reasoning formats of this model's chat outputs (None: no tokenizer)."""
        if self._replicas is not None:
            return self._replicas.chat_parsers
        return self._parsers

    @property
    def tokenizer(self) -> Any:  # transformers' tokenizer (untyped) or TextTokenizer, as loaded
        if self._replicas is not None:
            return self._replicas.tokenizer
        return self.loaded.tokenizer if self.loaded else None

    @property
    def replicas(self) -> tuple[AsyncEngine, ...]:
        """The engines of each replica with `data_parallel_size` (none without)."""
        return self._replicas.engines if self._replicas is not None else ()

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
        if self._replicas is not None:  # the replica set's generator itself: no hop per output
            return self._replicas.generate(
                prompt, params, request_id=request_id, extra_key=extra_key, options=options
            )
        return self._stream(prompt, params, request_id, extra_key, options)

    async def _stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> AsyncGenerator[RequestOutput, None]:
        reqs, rewrite = await self._requests(prompt, params, request_id, extra_key, options)
        assert self._link.loop is not None and self.scheduler is not None
        stream = Stream(self._link.loop, reqs, self.scheduler.sampling_rows.unread)
        rid = self._link.submit(reqs, stream, request_id)
        remaining = len(reqs)
        try:
            while remaining:
                item = stream.take()
                if item is None:
                    await stream.arm()
                    continue
                if item.finished:
                    remaining -= 1
                yield rewrite(item) if rewrite is not None else item
        finally:
            self._link.sinks.release(rid, request_id)
            if remaining:
                self._link.abort_quietly(rid)

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
        if self._replicas is not None:
            return await self._replicas.complete(
                prompt, params, request_id=request_id, extra_key=extra_key, options=options
            )
        reqs, rewrite = await self._requests(prompt, params, request_id, extra_key, options)
        for r in reqs:
            r.stream = False
        assert self._link.loop is not None
        collector = Collector(len(reqs), self._link.loop.create_future())
        rid = self._link.submit(reqs, collector, request_id)
        try:
            outs = await collector.done
        finally:
            self._link.sinks.release(rid, request_id)
            if not collector.done.done() or collector.done.cancelled():
                self._link.abort_quietly(rid)
        if rewrite is not None:
            outs = [rewrite(o) for o in outs]
        return outs[0] if len(outs) == 1 else outs

    async def generate_many(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        progress: bool = False,
    ) -> list[RequestOutput | list[RequestOutput]]:
        """Run many requests concurrently; results in prompt order."""
        self._check_alive()
        return await complete_many(self.complete, prompts, params, progress)

    async def abort(self, request_id: str) -> None:
        if self._replicas is not None:
            return await self._replicas.abort(request_id)
        self._link.abort(request_id)

    # ---- maintenance (run on the worker thread, between steps) ---------------------------

    async def flush_cache(self) -> bool:
        """Empty the radix cache; False (nothing done) while requests are running."""
        if self._replicas is not None:
            return await self._replicas.flush_cache()
        return bool(await self._link.ask(FlushCache))

    async def check_integrity(self) -> None:
        """Assert every KV slot is free, in the radix tree, or owned by a running request."""
        if self._replicas is not None:
            return await self._replicas.check_integrity()
        await self._link.ask(CheckIntegrity)

    async def stats(self) -> dict[str, int | float]:
        """The scheduler's and the worker's counters (sched/stats.py) and the watchdog's stalls;
        with replicas, theirs summed and the router's (replicas/stats.py)."""
        if self._replicas is not None:
            return await self._replicas.stats()
        stats = await self._link.ask(ReadStats)
        assert isinstance(stats, dict)
        stats["watchdog_stalls"] = self._link.stalls
        return stats

    @property
    def grammar_cache(self) -> GrammarCache | None:
        if self._replicas is not None:  # replica 0's: each compiles and keeps its own
            return self._replicas.engines[0].grammar_cache
        return self._grammars.cache

    # ---- internals -----------------------------------------------------------------------

    def _check_loop(self) -> None:
        if self._replicas is not None:
            return self._replicas.check_loop()
        self._link.check_loop()

    def _check_alive(self) -> None:
        if self._replicas is not None:
            return self._replicas.check_alive()
        self._link.check_alive()

    async def _requests(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> tuple[list[Request], ChatRewriter | None]:
        """A caller's request as validated `Request`s (chat rendered, grammar compiled and
        attached), and how its chat outputs are parsed; ValueError for anything wrong in it."""
        params = params or SamplingParams()
        if is_chat(prompt) and self._parsers is not None:
            self._check_alive()
        prompt, params, rewrite = prepare_chat(self.tokenizer, self._parsers, prompt, params, options)
        spec = params.grammar if isinstance(params, SamplingParams) else None
        if spec is not None:
            self._check_alive()
            if self.tokenizer is None:
                raise ValueError(f"{spec.kind}: structured output needs a model with a tokenizer")
        compiled = await self._grammars.compile(params)
        self._check_alive()
        assert self.loaded is not None
        reqs = make_requests(
            self.loaded,
            self.context_length,
            prompt,
            params,
            request_id,
            extra_key,
            self._link.sinks.new_key,
            self._arrival,
        )
        self._grammars.attach(reqs, compiled)
        return reqs, rewrite
