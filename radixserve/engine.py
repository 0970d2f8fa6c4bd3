"""`AsyncEngine`: the object most users touch (`Engine`, in blocking.py, wraps it).

The engine lives in the caller's asyncio event loop. Requests are tokenized
and validated there (a bad request raises in the caller and never reaches the
worker); the worker thread (`sched/worker.py`) schedules and runs the model;
its outputs come back once per step through `loop.call_soon_threadsafe` into
one queue per request, which `generate()` drains as an async generator.
Cancelling the task aborts the request, and so does closing the generator
(see `generate`).

An engine belongs to the event loop it was started in (`engine.loop`); calls
from another loop raise `RuntimeError` at once. Internally each submission
has its own key (the request id, or the id plus a suffix while an earlier
request of the same id is still winding down), so late outputs of a cancelled
request never reach a new request that reuses its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.kv_pool import KVPool
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.config import EngineConfig
from radixserve.constrained.cache import GrammarCache
from radixserve.model.loader import LoadedModel, load_model
from radixserve.outputs import RequestOutput
from radixserve.prompts import Prompt, tokenize_prompt
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.kernels import make_kernels, use_kernels
from radixserve.runtime.runner import ModelRunner
from radixserve.sampling_params import SamplingParams
from radixserve.sched.request import Request
from radixserve.sched.scheduler import Scheduler
from radixserve.sched.worker import Worker

_CPU_KV_BUDGET = 1 << 30  # bytes of KV pool on the CPU when nothing is said
# Engines build one at a time: transformers' lazy imports are not thread-safe.
_BUILD_LOCK = threading.Lock()


class EngineDeadError(RuntimeError):
    """The worker thread failed (or its event loop closed); the engine takes no more requests."""


class EngineClosedError(EngineDeadError):
    """The engine was shut down (`shutdown(drain=False)`, `Engine.close()`) before the request ended."""


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        self.config = (
            replace(config or EngineConfig(), **overrides) if overrides else (config or EngineConfig())
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException] | _Collector] = {}
        self._active = 0  # completions submitted and not yet finished
        self._idle: asyncio.Event | None = None
        self._arrival = itertools.count()
        self._error: BaseException | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._owner: dict[str, str] = {}  # caller's request id -> key of its live submission
        self._pending: dict[str, int] = {}  # key -> completions whose final output is still to come
        self._alias: dict[str, str] = {}  # key -> caller's request id, where the two differ
        self._keys = itertools.count()
        self._calls: set[asyncio.Future[Any]] = set()  # maintenance calls waiting on the worker
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.pool: KVPool | None = None
        self.context_length = 0
        self._grammars: GrammarCache | None = None  # built on the first constrained request
        self._grammar_lock: asyncio.Lock | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> AsyncEngine:
        """Load the model and start the worker; concurrent calls share one start."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop and (self._worker or self._start_task):
            raise self._wrong_loop()
        if self._worker is not None and self._start_task is None:
            return self
        if self._start_task is None:
            self._loop = loop
            self._start_task = loop.create_task(self._start())
        # Shielded: one impatient caller's cancel must not leave a half-built engine behind.
        await asyncio.shield(self._start_task)
        return self

    async def _start(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        self._error = None
        try:
            await asyncio.to_thread(self._build)
        except BaseException:
            self._loop = None
            raise
        finally:
            self._start_task = None
        assert self._worker is not None
        self._worker.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this engine was started in (None before `start()`); it serves only that loop."""
        return self._loop

    def _build(self) -> None:
        with _BUILD_LOCK:
            self._build_locked()

    def _build_locked(self) -> None:
        cfg = self.config
        device, dtype = cfg.torch_device(), cfg.torch_dtype()
        loaded = load_model(cfg.model, dtype=dtype, device=device, load_format=cfg.load_format)
        use_kernels(loaded.model, make_kernels(cfg.layer_kernels, device, dtype))
        mc = loaded.config
        self.context_length = min(cfg.context_length or mc.max_context_len, mc.max_context_len)
        pool_cfg = mc.kv_pool_config(dtype, device)
        num_slots = self._kv_slots(pool_cfg.bytes_per_slot, device)
        # One slot more than the allocator hands out: the scratch slot that padded
        # CUDA-graph rows write to.
        pool = KVPool(pool_cfg, num_slots + 1)
        attn = make_attention_backend(
            cfg.attention_backend, pool, mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.attn_scale
        )
        allocator = SlotAllocator(num_slots)
        cache = RadixCache(allocator, page_size=cfg.page_size)
        table = ReqToSlotTable(cfg.max_running_requests, self.context_length + 1, device=device)
        sched_cfg = cfg.scheduler_config()
        if not attn.supports_cascade:  # its kernels would ignore the groups: don't form them
            sched_cfg = replace(sched_cfg, cascade_min_shared=0)
        elif sched_cfg.cascade_min_shared:
            attn.prepare_cascade()  # kernels built at start, not in the first cascade step
        self.scheduler = Scheduler(sched_cfg, allocator, cache, table, loaded.tokenizer)
        runner = ModelRunner(
            loaded.model, attn, mc.vocab_size, cfg.max_running_requests, device, slot_table=table.device_table
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # weights and pool filled before the runner's stream reads them
        if cfg.cuda_graph and device.type == "cuda":
            max_kv = min(cfg.max_running_requests * (self.context_length + 1), 1 << 26)
            runner.enable_cuda_graphs(cfg.max_running_requests, max_kv, scratch_slot=num_slots)
        self.loaded = loaded
        self.pool = pool
        self._worker = Worker(
            self.scheduler, runner, self._post, self._fail, cfg.overlap_enabled, self._grammar_backend_now
        )

    def _kv_slots(self, bytes_per_slot: int, device: Any) -> int:
        cfg = self.config
        if cfg.kv_cache_tokens is not None:
            return cfg.kv_cache_tokens
        if cfg.kv_cache_bytes is not None:
            return max(1, cfg.kv_cache_bytes // bytes_per_slot)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            # Room for activations, logits and graphs stays outside the fraction.
            slots = int(free * cfg.mem_fraction) // bytes_per_slot - 1
            if slots < self.context_length:
                raise RuntimeError(
                    f"only {free / 2**30:.1f} GiB of GPU memory is free after loading the model: "
                    f"{max(slots, 0)} KV slots, fewer than one full context ({self.context_length}); "
                    "free memory, raise mem_fraction or lower context_length"
                )
            return slots
        return max(1, min(_CPU_KV_BUDGET // bytes_per_slot, 64 * self.context_length))

    async def shutdown(self, drain: bool = True) -> None:
        """Stop the worker; with `drain`, first let every submitted request finish.

        Without it, every request still pending ends at once: its `complete()` or
        `generate()` raises `EngineClosedError`. Later calls raise `RuntimeError`."""
        if self._start_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._start_task)
        if self._worker is None:
            return
        if asyncio.get_running_loop() is not self._loop:
            assert self._loop is not None
            if not self._loop.is_closed():
                raise self._wrong_loop()
            drain = False  # its loop is gone, and with it everyone who could wait for a result
        elif drain and self._error is None:
            assert self._idle is not None
            await self._idle.wait()
        worker, self._worker = self._worker, None
        await asyncio.to_thread(worker.stop)
        if self._loop is not None and not self._loop.is_closed():
            self._close_sinks(EngineClosedError("the engine was shut down before this request finished"))
        # Drop the model, pool and graphs so their device memory can be reused.
        self.loaded = self.scheduler = self.pool = None

    async def __aenter__(self) -> AsyncEngine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown(drain=exc[0] is None)

    @property
    def healthy(self) -> bool:
        loop_ok = self._loop is not None and not self._loop.is_closed()
        return self._worker is not None and self._worker.alive and self._error is None and loop_ok

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer if self.loaded else None

    # ---- requests ------------------------------------------------------------------------

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request (n completions interleaved, told apart by `index`).

        The request is aborted (and its KV freed) when the generator is closed
        before the end: at once when the task is cancelled, on `await gen.aclose()`
        or at the end of `async with contextlib.aclosing(engine.generate(...))`;
        after a plain `break`, when the generator is garbage-collected (in CPython
        right away, unless the caller still holds a reference to it).
        """
        params = params or SamplingParams()
        compiled = await self._compile_grammar(params)
        reqs = self._make_requests(prompt, params, request_id, extra_key)
        self._attach_grammar(reqs, compiled)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        rid = self._submit(reqs, queue, request_id)
        remaining = len(reqs)
        try:
            while remaining:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    remaining -= 1
                yield item
        finally:
            self._release_sink(rid, request_id)
            if remaining:
                self._abort_quietly(rid)

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> RequestOutput | list[RequestOutput]:
        """The final output (a list of n outputs, by index, when `params.n > 1`).

        Unlike `generate`, nothing wakes the caller before the end: under many
        concurrent requests the event loop stays quiet and the worker keeps the GIL.
        """
        params = params or SamplingParams()
        compiled = await self._compile_grammar(params)
        reqs = self._make_requests(prompt, params, request_id, extra_key)
        self._attach_grammar(reqs, compiled)
        for r in reqs:
            r.stream = False
        assert self._loop is not None
        collector = _Collector(len(reqs), self._loop.create_future())
        rid = self._submit(reqs, collector, request_id)
        try:
            outs = await collector.done
        finally:
            self._release_sink(rid, request_id)
            if not collector.done.done() or collector.done.cancelled():
                self._abort_quietly(rid)
        return outs[0] if len(outs) == 1 else outs

    async def generate_many(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        progress: bool = False,
    ) -> list[RequestOutput | list[RequestOutput]]:
        """Run many requests concurrently; results in prompt order."""
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"generate_many: {len(prompts)} prompts but {len(plist)} SamplingParams")
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(prompts), desc="radixserve")

        async def one(p: Prompt, sp: SamplingParams | None) -> RequestOutput | list[RequestOutput]:
            res = await self.complete(p, sp)
            if bar is not None:
                bar.update(1)
            return res

        self._check_alive()
        tasks = [asyncio.ensure_future(one(p, sp)) for p, sp in zip(prompts, plist)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # One failure (e.g. an invalid prompt) ends the whole call: abort the others too.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if bar is not None:
                bar.close()

    def _submit(self, reqs: list[Request], sink: Any, request_id: str | None) -> str:
        rid = reqs[0].rid  # the submission's key
        user = request_id or rid
        self._streams[rid] = sink
        self._owner[user] = rid
        self._pending[rid] = len(reqs)
        if user != rid:
            self._alias[rid] = user
        self._active += len(reqs)
        assert self._idle is not None and self._worker is not None
        self._idle.clear()
        self._worker.submit("add", reqs)
        return rid

    def _release_sink(self, key: str, request_id: str | None) -> None:
        """The caller stopped listening to submission `key`; its request id may be reused."""
        self._streams.pop(key, None)
        user = request_id or key
        if self._owner.get(user) == key:
            del self._owner[user]

    def _abort_quietly(self, rid: str) -> None:
        if self._worker is not None and self._error is None:
            self._worker.submit("abort", (rid, "cancelled by the caller"))

    async def abort(self, request_id: str) -> None:
        self._check_loop()
        if self._worker is not None:
            key = self._owner.get(request_id, request_id)
            self._worker.submit("abort", (key, "aborted by abort()"))

    # ---- maintenance (run on the worker thread, between steps) ---------------------------

    async def _call(self, fn: Any) -> Any:
        self._check_alive()
        assert self._loop is not None and self._worker is not None
        fut: asyncio.Future[Any] = self._loop.create_future()

        def done(value: Any, err: BaseException | None) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_exception(err) if err else fut.set_result(value)

            self._to_loop(settle)

        self._calls.add(fut)
        try:
            self._worker.submit("call", (fn, done))
            return await fut
        finally:
            self._calls.discard(fut)

    async def flush_cache(self) -> bool:
        """Empty the radix cache; False (nothing done) while requests are running."""

        def flush(s: Scheduler) -> bool:
            if s.has_work or s.cache is None:
                return s.cache is None and not s.has_work
            s.cache.reset()
            return True

        return bool(await self._call(flush))

    async def check_integrity(self) -> None:
        """Assert every KV slot is free, in the radix tree, or owned by a running request."""
        await self._call(lambda s: s.check_integrity())

    async def stats(self) -> dict[str, Any]:
        def read(s: Scheduler) -> dict[str, Any]:
            return {
                "waiting": len(s.waiting),
                "running": len(s.running),
                "free_slots": s.allocator.num_free,
                "total_slots": s.allocator.num_slots,
                "cached_tokens": s.cache.total_size if s.cache else 0,
                "prompt_tokens": s.prompt_tokens_admitted,
                "prompt_tokens_cached": s.cached_tokens_admitted,
                "retractions": s.retractions,
                "forward_steps": self._worker.steps if self._worker else 0,
                "jump_forward_tokens": s.jump_forward_tokens,
                # Forced tokens appended without a forward pass each, less the in-flight
                # tokens those jumps discarded (overlap mode).
                "forward_passes_saved": s.jump_forward_tokens - s.jump_discarded,
                "mask_fill_s": self._worker.mask_fill_s if self._worker else 0.0,
                "mask_rows": self._worker.mask_rows if self._worker else 0,
                # Shared-prefix (cascade) decode: steps that read shared prefixes once per
                # group, and the K/V slot reads (per layer) they avoided.
                "cascade_steps": s.grouper.steps if s.grouper is not None else 0,
                "cascade_saved_slot_reads": s.grouper.saved_tokens if s.grouper is not None else 0,
            }

        return dict(await self._call(read))

    # ---- structured output (radixserve/constrained/) -------------------------------------

    async def _compile_grammar(self, params: SamplingParams) -> Any:
        """The compiled grammar of `params` (None if unconstrained), compiled in a thread
        while this request waits outside the batch; ValueError if it does not compile."""
        spec = params.grammar if isinstance(params, SamplingParams) else None
        if spec is None:
            return None
        self._check_alive()
        if self.tokenizer is None:
            raise ValueError(f"{spec.kind}: structured output needs a model with a tokenizer")
        if self._grammars is None:
            if self._grammar_lock is None:
                self._grammar_lock = asyncio.Lock()
            async with self._grammar_lock:
                if self._grammars is None:
                    backend = await asyncio.to_thread(self._grammar_backend)
                    cfg = self.config
                    self._grammars = GrammarCache(
                        backend, cfg.grammar_cache_size, cfg.grammar_compile_timeout
                    )
        assert self._grammars is not None
        return await self._grammars.get(spec)

    def _grammar_backend(self) -> Any:
        from radixserve.constrained.xgrammar_backend import XGrammarBackend

        assert self.loaded is not None
        eos = self.loaded.eos_token_ids or self.loaded.config.eos_token_ids
        return XGrammarBackend(self.loaded.tokenizer, self.loaded.config.vocab_size, eos)

    def _attach_grammar(self, reqs: list[Request], compiled: Any) -> None:
        if compiled is None:
            return
        assert self._grammars is not None
        for r in reqs:  # one matcher per completion
            r.grammar = self._grammars.backend.matcher(compiled)

    def _grammar_backend_now(self) -> Any:  # worker thread: set before any matcher exists
        assert self._grammars is not None
        return self._grammars.backend

    @property
    def grammar_cache(self) -> GrammarCache | None:
        return self._grammars

    # ---- internals -----------------------------------------------------------------------

    def _wrong_loop(self) -> RuntimeError:
        return RuntimeError(
            "this AsyncEngine belongs to the event loop it was started in (engine.loop), and this call "
            "runs in another one; use the blocking radixserve.Engine from other threads, or submit the "
            "coroutine to the engine's loop: asyncio.run_coroutine_threadsafe(coro, engine.loop)"
        )

    def _check_loop(self) -> None:
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise self._wrong_loop()

    def _check_alive(self) -> None:
        self._check_loop()
        if self._error is not None:
            raise EngineDeadError(f"the engine's worker failed: {self._error!r}") from self._error
        if self._worker is None:
            raise RuntimeError(
                "the engine is not running: use `async with engine:` or `await engine.start()`"
            )

    def _make_requests(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None, extra_key: str | None
    ) -> list[Request]:
        self._check_alive()
        assert self.loaded is not None
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = tokenize_prompt(self.tokenizer, prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self.context_length:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; the context is {self.context_length} tokens "
                "(the prompt plus at least one generated token must fit)"
            )
        vocab = self.loaded.config.vocab_size
        if max(ids) >= vocab or min(ids) < 0:
            raise ValueError(f"input_ids must be token ids in [0, {vocab})")
        params.check_vocab(vocab)
        rid = request_id or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise TypeError(f"request_id must be a str, got {type(rid).__name__}")
        if extra_key is not None and not isinstance(extra_key, str):
            raise TypeError(f"extra_key must be a str or None, got {type(extra_key).__name__}")
        if rid in self._owner:
            raise ValueError(f"request_id {rid!r} is already running")
        if rid in self._pending:  # an earlier request of this id is still winding down
            rid = f"{rid}\x00{next(self._keys)}"
        eos = frozenset(self.loaded.eos_token_ids or self.loaded.config.eos_token_ids)
        reqs = []
        for i in range(params.n):
            # Completions of one seeded request differ from each other but not between runs.
            p = params if params.n == 1 or params.seed is None else replace(params, seed=params.seed + i, n=1)
            reqs.append(
                Request(
                    rid, i, list(ids), p, eos, self.context_length, extra_key, arrival=next(self._arrival)
                )
            )
        return reqs

    def _to_loop(self, fn: Any, *args: Any) -> None:  # worker thread
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell, so stop serving
            if self._error is None:
                self._error = EngineDeadError(
                    "the event loop this engine was started in is closed; start a new engine in your loop"
                )
            worker = self._worker
            if worker is not None:
                worker.stop()

    def _post(self, outputs: list[RequestOutput]) -> None:  # worker thread
        self._to_loop(self._dispatch, outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:  # event loop
        for out in outputs:
            key = out.request_id
            user = self._alias.get(key) if self._alias else None
            if user is not None:
                out = replace(out, request_id=user)
            q = self._streams.get(key)
            if q is not None:
                q.put_nowait(out)
            if out.finished:
                self._active -= 1
                left = self._pending.get(key, 0) - 1
                if left > 0:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
                    self._alias.pop(key, None)
        if self._active <= 0 and self._idle is not None:
            self._active = 0
            self._idle.set()

    def _close_sinks(self, err: BaseException) -> None:  # event loop
        """Every pending request and maintenance call ends with `err`; nobody waits forever."""
        for q in self._streams.values():
            q.put_nowait(err)
        for fut in self._calls:
            if not fut.done():
                fut.set_exception(err)
        self._streams.clear()
        self._owner.clear()
        self._pending.clear()
        self._alias.clear()
        self._active = 0
        if self._idle is not None:
            self._idle.set()

    def _fail(self, err: BaseException) -> None:  # worker thread
        def fail_all() -> None:
            self._error = err
            self._close_sinks(EngineDeadError(f"the engine's worker failed: {err!r}"))

        self._to_loop(fail_all)


class _Collector:
    """The sink of `complete()`: keeps the final output of each completion, resolves once."""

    def __init__(self, n: int, done: asyncio.Future[list[RequestOutput]]) -> None:
        self.n = n
        self.done = done
        self.final: dict[int, RequestOutput] = {}

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        if self.done.done():
            return
        if isinstance(item, BaseException):
            self.done.set_exception(item)
        elif item.finished:
            self.final[item.index] = item
            if len(self.final) == self.n:
                self.done.set_result([self.final[i] for i in sorted(self.final)])
