"""`AsyncEngine`: the object most users touch (`Engine`, in blocking.py, wraps it).

The engine lives in the caller's asyncio event loop. Requests are tokenized
and validated there (a bad request raises in the caller and never reaches the
worker); the worker thread (`sched/worker.py`) schedules and runs the model;
its outputs come back once per step through `loop.call_soon_threadsafe` into
one queue per request, which `generate()` drains as an async generator.
Leaving the `async for` early or cancelling the task aborts the request.
"""

from __future__ import annotations

import asyncio
import itertools
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
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.runner import ModelRunner
from radixserve.sampling_params import SamplingParams
from radixserve.sched.request import Request
from radixserve.sched.scheduler import Scheduler
from radixserve.sched.worker import Worker

Prompt = str | Sequence[dict[str, Any]] | Sequence[int]

_CPU_KV_BUDGET = 1 << 30  # bytes of KV pool on the CPU when nothing is said


class EngineDeadError(RuntimeError):
    """The worker thread failed; the engine takes no more requests."""


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
        self.loaded: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.pool: KVPool | None = None
        self.context_length = 0
        self._grammars: GrammarCache | None = None  # built on the first constrained request
        self._grammar_lock: asyncio.Lock | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> AsyncEngine:
        if self._worker is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        await asyncio.to_thread(self._build)
        assert self._worker is not None
        self._worker.start()
        return self

    def _build(self) -> None:
        cfg = self.config
        device, dtype = cfg.torch_device(), cfg.torch_dtype()
        loaded = load_model(cfg.model, dtype=dtype, device=device, load_format=cfg.load_format)
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
        table = ReqToSlotTable(cfg.max_running_requests, self.context_length + 1)
        self.scheduler = Scheduler(cfg.scheduler_config(), allocator, cache, table, loaded.tokenizer)
        runner = ModelRunner(loaded.model, attn, mc.vocab_size, cfg.max_running_requests, device)
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
        """Stop the worker; with `drain`, first let every submitted request finish."""
        if self._worker is None:
            return
        if drain and self._error is None:
            assert self._idle is not None
            await self._idle.wait()
        worker, self._worker = self._worker, None
        await asyncio.to_thread(worker.stop)
        # Drop the model, pool and graphs so their device memory can be reused.
        self.loaded = self.scheduler = self.pool = None

    async def __aenter__(self) -> AsyncEngine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown(drain=exc[0] is None)

    @property
    def healthy(self) -> bool:
        return self._worker is not None and self._worker.alive and self._error is None

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
        """Stream outputs of one request (n completions interleaved, told apart by `index`)."""
        params = params or SamplingParams()
        compiled = await self._compile_grammar(params)
        reqs = self._make_requests(prompt, params, request_id, extra_key)
        self._attach_grammar(reqs, compiled)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        rid = self._submit(reqs, queue)
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
            self._streams.pop(rid, None)
            if remaining:
                self._abort_quietly(rid)

    async def complete(
        self, prompt: Prompt, params: SamplingParams | None = None, **kw: Any
    ) -> RequestOutput | list[RequestOutput]:
        """The final output (a list of n outputs, by index, when `params.n > 1`).

        Unlike `generate`, nothing wakes the caller before the end: under many
        concurrent requests the event loop stays quiet and the worker keeps the GIL.
        """
        params = params or SamplingParams()
        compiled = await self._compile_grammar(params)
        reqs = self._make_requests(prompt, params, kw.get("request_id"), kw.get("extra_key"))
        self._attach_grammar(reqs, compiled)
        for r in reqs:
            r.stream = False
        assert self._loop is not None
        collector = _Collector(len(reqs), self._loop.create_future())
        rid = self._submit(reqs, collector)
        try:
            outs = await collector.done
        finally:
            self._streams.pop(rid, None)
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

        try:
            return list(await asyncio.gather(*(one(p, sp) for p, sp in zip(prompts, plist))))
        finally:
            if bar is not None:
                bar.close()

    def _submit(self, reqs: list[Request], sink: Any) -> str:
        rid = reqs[0].rid
        self._streams[rid] = sink
        self._active += len(reqs)
        assert self._idle is not None and self._worker is not None
        self._idle.clear()
        self._worker.submit("add", reqs)
        return rid

    def _abort_quietly(self, rid: str) -> None:
        if self._worker is not None and self._error is None:
            self._worker.submit("abort", (rid, "cancelled by the caller"))

    async def abort(self, request_id: str) -> None:
        if self._worker is not None:
            self._worker.submit("abort", (request_id, "aborted by abort()"))

    # ---- maintenance (run on the worker thread, between steps) ---------------------------

    async def _call(self, fn: Any) -> Any:
        self._check_alive()
        assert self._loop is not None and self._worker is not None
        fut: asyncio.Future[Any] = self._loop.create_future()

        def done(value: Any, err: BaseException | None) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_exception(err) if err else fut.set_result(value)

            self._loop.call_soon_threadsafe(settle)  # type: ignore[union-attr]

        self._worker.submit("call", (fn, done))
        return await fut

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

    def _check_alive(self) -> None:
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
        ids = self._tokenize(prompt)
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
        if rid in self._streams:
            raise ValueError(f"request_id {rid!r} is already running")
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

    def _tokenize(self, prompt: Prompt) -> list[int]:
        tok = self.tokenizer
        if isinstance(prompt, str):
            if tok is None:
                raise ValueError("this model has no tokenizer: pass token ids instead of text")
            return list(tok.encode(prompt, add_special_tokens=True))
        seq = list(prompt)
        if seq and isinstance(seq[0], dict):
            if tok is None or not getattr(tok, "chat_template", None):
                raise ValueError("this model has no chat template: pass text or token ids")
            text = tok.apply_chat_template(seq, tokenize=False, add_generation_prompt=True)
            return list(tok.encode(text, add_special_tokens=False))
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
            raise TypeError("a prompt is a string, a list of chat messages (dicts) or a list of token ids")
        return [int(t) for t in seq]  # type: ignore[call-overload]

    def _post(self, outputs: list[RequestOutput]) -> None:  # worker thread
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:  # event loop
        for out in outputs:
            q = self._streams.get(out.request_id)
            if q is not None:
                q.put_nowait(out)
            if out.finished:
                self._active -= 1
        if self._active <= 0 and self._idle is not None:
            self._active = 0
            self._idle.set()

    def _fail(self, err: BaseException) -> None:  # worker thread
        assert self._loop is not None

        def fail_all() -> None:
            self._error = err
            for q in self._streams.values():
                q.put_nowait(EngineDeadError(f"the engine's worker failed: {err!r}"))
            self._active = 0
            if self._idle is not None:
                self._idle.set()

        self._loop.call_soon_threadsafe(fail_all)


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
