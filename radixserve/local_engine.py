"""`LocalEngine`: one engine, the core an `AsyncEngine` without replicas hands its calls to.

It lives in the caller's asyncio event loop. Requests are tokenized and
validated there (a bad request raises in the caller and never reaches the
worker); the worker thread (`sched/worker.py`) schedules and runs the model;
its outputs come back once per step through `loop.call_soon_threadsafe` into
one sink per request (`sinks.py`), which `generate()` drains as an async
generator: one output per completion per step while the caller keeps up,
fewer and larger ones when it reads slower than the engine produces (the
worker builds no output for a completion whose previous one is unread).
Closing the generator before its end aborts the request.

It belongs to the event loop it was started in (`loop`); calls from another
loop raise `RuntimeError` at once. What it runs on is built in
`engine_build.py`; the link between the caller's loop and the worker thread
(submitting, aborting, queries, failures) is `worker_link.py`, and routing
outputs to their callers `sinks.py`; compiling grammars for structured output
is `grammar_compiler.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import traceback
from collections.abc import AsyncGenerator
from typing import Any

import torch

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
from radixserve.own_thread import in_own_thread
from radixserve.prompts import Prompt, is_chat
from radixserve.sampling_params import SamplingParams
from radixserve.sched.messages import CheckIntegrity, FlushCache, ReadStats
from radixserve.sched.request import Request
from radixserve.sched.scheduler import Scheduler
from radixserve.sched.worker import Worker
from radixserve.sinks import Collector, Stream
from radixserve.submission import make_requests
from radixserve.worker_link import WorkerLink


class LocalEngine:
    """One engine: a model, a KV pool and a worker thread (see the module docstring)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._link = WorkerLink()
        self._arrival = itertools.count()
        self._start_task: asyncio.Task[None] | None = None
        self._built: Worker | None = None  # the worker `_build` made, until `_start` runs it
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.pool: KVPool | None = None
        self.context_length = 0
        self.grammars = GrammarCompiler(config, lambda: xgrammar_backend(self.loaded))
        self._parsers: ChatParsers | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and start the worker; concurrent calls share one start."""
        loop = asyncio.get_running_loop()
        link = self._link
        if link.loop is not None and loop is not link.loop and (link.worker or self._start_task):
            raise RuntimeError(WRONG_LOOP)
        if link.worker is not None and self._start_task is None:
            return
        if self._start_task is None:
            link.loop = loop
            self._start_task = loop.create_task(self._start())
        # Shielded: one impatient caller's cancel must not leave a half-built engine behind.
        await asyncio.shield(self._start_task)

    async def _start(self) -> None:
        self._link.reset()
        try:
            await in_own_thread(self._build)
        except BaseException as e:
            self._link.loop = None
            self._release_failed_build(e)
            raise
        finally:
            self._start_task = None
        worker, self._built = self._built, None
        assert worker is not None
        self._link.run(worker, self.config.watchdog_timeout_s)

    def _release_failed_build(self, e: BaseException) -> None:
        """Free what a failed start built (weights, KV pool, graphs) now, not when the caller
        drops the exception: its traceback holds the build's frames and their locals, and a
        notebook keeps the last one for good, so a retry with a smaller configuration would
        find the device still full. The traceback keeps its lines; the frames lose their
        locals."""
        self.loaded = self.scheduler = self.pool = None
        self._built = None
        traceback.clear_frames(e.__traceback__)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

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
            self.grammars.backend_now,
        )

    async def shutdown(self, drain: bool = True) -> None:
        """Stop the worker (`AsyncEngine.shutdown`)."""
        if self._start_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._start_task)
        if self._link.worker is None:
            return
        await self._link.stop(drain)
        self.grammars.close()  # compiles still running are not waited for
        # Drop the model, pool and graphs so their device memory can be reused.
        self.loaded = self.scheduler = self.pool = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._link.loop

    @property
    def worker(self) -> Worker | None:
        return self._link.worker

    @property
    def healthy(self) -> bool:
        return self._link.healthy

    @property
    def chat_parsers(self) -> ChatParsers | None:
        return self._parsers

    @property
    def tokenizer(self) -> Any:  # transformers' tokenizer (untyped) or TextTokenizer, as loaded
        return self.loaded.tokenizer if self.loaded else None

    @property
    def grammar_cache(self) -> GrammarCache | None:
        return self.grammars.cache

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
        """`AsyncEngine.generate`: the outputs of one request, as the worker posts them."""
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
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> RequestOutput | list[RequestOutput]:
        """`AsyncEngine.complete`: the final outputs, collected off the caller's loop."""
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

    async def abort(self, request_id: str) -> None:
        self._link.abort(request_id)

    # ---- maintenance (run on the worker thread, between steps) ---------------------------

    async def flush_cache(self) -> bool:
        return bool(await self._link.ask(FlushCache))

    async def check_integrity(self) -> None:
        await self._link.ask(CheckIntegrity)

    async def stats(self) -> dict[str, int | float]:
        stats = await self._link.ask(ReadStats)
        assert isinstance(stats, dict)
        stats["watchdog_stalls"] = self._link.stalls
        return stats

    # ---- internals -----------------------------------------------------------------------

    def check_alive(self) -> None:
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
            self.check_alive()
        prompt, params, rewrite = prepare_chat(self.tokenizer, self._parsers, prompt, params, options)
        spec = params.grammar if isinstance(params, SamplingParams) else None
        if spec is not None:
            self.check_alive()
            if self.tokenizer is None:
                raise ValueError(f"{spec.kind}: structured output needs a model with a tokenizer")
        compiled = await self.grammars.compile(params)
        self.check_alive()
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
        self.grammars.attach(reqs, compiled)
        return reqs, rewrite
