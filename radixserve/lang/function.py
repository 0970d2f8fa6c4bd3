"""`@function`: a program, run with `run`, `arun`, `run_batch` or `arun_batch`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import multiprocessing
import threading
from collections.abc import Callable, Sequence
from typing import Any

from radixserve.lang.backend import Backend, GenParams
from radixserve.lang.bridge import call_async, call_sync, loop_for_async, loop_for_sync
from radixserve.lang.chat_template import ChatTemplate
from radixserve.lang.defaults import resolve_backend
from radixserve.lang.prefix import common_prefix
from radixserve.lang.program import Program
from radixserve.lang.state import ProgramState

# run()'s sampling defaults, by SGLang's names; every other keyword is a program argument.
_SAMPLING = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "return_logprob": "return_logprob",
    "logprob_start_len": "logprob_start_len",
    "top_logprobs_num": "top_logprobs_num",
}
_IGNORED = ("return_text_in_logprobs",)


def _defaults(sampling: dict[str, Any]) -> GenParams:
    kw = {_SAMPLING[k]: v for k, v in sampling.items() if v is not None}
    if "stop" in kw:
        kw["stop"] = (kw["stop"],) if isinstance(kw["stop"], str) else tuple(kw["stop"])
    if "stop_token_ids" in kw:
        kw["stop_token_ids"] = tuple(kw["stop_token_ids"])
    for flag in ("return_logprob", "ignore_eos"):
        if flag in kw:
            kw[flag] = bool(kw[flag])
    return GenParams(**kw)


def _sampling_defaults(sampling: dict[str, Any]) -> GenParams:
    unknown = set(sampling) - set(_SAMPLING) - set(_IGNORED)
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    return _defaults({k: v for k, v in sampling.items() if k in _SAMPLING})


class SglFunction:
    """A program: `func(s, *args)` appends text and calls to the state `s`."""

    def __init__(self, func: Callable[..., Any], bind_arguments: dict[str, Any] | None = None) -> None:
        params = list(inspect.signature(func).parameters)
        if not params or params[0] != "s":
            raise TypeError(f"a program's first parameter must be `s` ({func.__name__} has {params[:1]})")
        self.func = func
        self.arg_names = params[1:]
        self.bind_arguments = dict(bind_arguments or {})
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> SglFunction:
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.__name__} has no parameters {sorted(unknown)}")
        return SglFunction(self.func, {**self.bind_arguments, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    # ---- arguments -----------------------------------------------------------------------

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], GenParams]:
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in _SAMPLING}
        for k in _IGNORED:
            kwargs.pop(k, None)
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.__name__} takes {len(self.arg_names)} arguments, got {len(args)}")
        prog_kw = {**self.bind_arguments, **dict(zip(self.arg_names, args)), **kwargs}
        inspect.signature(self.func).bind(None, **prog_kw)  # a missing or unknown argument: TypeError here
        return prog_kw, _defaults(sampling)

    def _batch_kwargs(self, batch: Sequence[Any]) -> list[dict[str, Any]]:
        out = []
        for item in batch:
            if isinstance(item, dict):
                out.append({**self.bind_arguments, **item})
            elif isinstance(item, (list, tuple)):
                out.append({**self.bind_arguments, **dict(zip(self.arg_names, item))})
            else:
                raise TypeError("run_batch takes a list of dicts (or of argument tuples)")
            inspect.signature(self.func).bind(None, **out[-1])
        return out

    # ---- blocking ------------------------------------------------------------------------

    @staticmethod
    def _prepare_sync(backend: Backend) -> tuple[asyncio.AbstractEventLoop, ChatTemplate]:
        loop = loop_for_sync(backend)

        async def prep() -> ChatTemplate:
            await backend.start()
            return await backend.chat_template()

        return loop, call_sync(loop, prep)

    def run(self, *args: Any, stream: bool = False, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run the program and return its state (with stream=True at once, still running).
        A failure raises ProgramError (its `state` has the text so far and `error()`)."""
        prog_kw, defaults = self._split(args, kwargs)
        be = resolve_backend(backend)
        loop, template = self._prepare_sync(be)
        prog = Program(be, loop, defaults, template, stream)
        if stream:
            threading.Thread(target=prog.run_body, args=(self.func, prog_kw), daemon=True).start()
            return prog.state
        prog.run_body(self.func, prog_kw)
        prog.finished.result()
        return prog.result()

    def run_batch(
        self,
        batch_kwargs: Sequence[Any],
        *,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run one program per item concurrently; states in order. A failed program does not
        stop the others: its state's `error()` says why."""
        batch = self._batch_kwargs(batch_kwargs)
        if not batch:
            return []
        defaults = _sampling_defaults(sampling)
        be = resolve_backend(backend)
        loop, template = self._prepare_sync(be)
        prefix = common_prefix(self.func, batch, template) if len(batch) > 1 else ""
        if prefix:
            call_sync(loop, lambda: be.cache_prefix(prefix))
        threads = max(64, multiprocessing.cpu_count() * 16) if num_threads == "auto" else int(num_threads)
        bar = _bar(len(batch), progress_bar)

        def one(kw: dict[str, Any]) -> ProgramState:
            prog = Program(be, loop, defaults, template, False)
            prog.run_body(self.func, kw)
            prog.finished.result()
            _settle(prog)
            if bar is not None:
                bar.update(1)
            return prog.state

        try:
            with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(batch)))) as pool:
                return list(pool.map(one, batch))
        finally:
            if bar is not None:
                bar.close()

    # ---- async ---------------------------------------------------------------------------

    @staticmethod
    async def _prepare_async(backend: Backend) -> tuple[asyncio.AbstractEventLoop, ChatTemplate]:
        loop = await loop_for_async(backend)

        async def prep() -> ChatTemplate:
            await backend.start()
            return await backend.chat_template()

        return loop, await call_async(loop, prep)

    async def arun(
        self, *args: Any, stream: bool = False, backend: Any = None, **kwargs: Any
    ) -> ProgramState:
        """`run` for async code, from any event loop; the program's calls run on the engine's
        loop (this one, when the engine started here: no thread hops to reach it)."""
        prog_kw, defaults = self._split(args, kwargs)
        be = await _aresolve(backend)
        loop, template = await self._prepare_async(be)
        prog = Program(be, loop, defaults, template, stream)
        body = asyncio.get_running_loop().run_in_executor(None, prog.run_body, self.func, prog_kw)
        if stream:
            _keep(body)
            return prog.state
        await body
        await asyncio.wrap_future(prog.finished)
        return prog.result()

    async def arun_batch(
        self,
        batch_kwargs: Sequence[Any],
        *,
        backend: Any = None,
        concurrency: int = 64,
        progress_bar: bool = False,
        **sampling: Any,
    ) -> list[ProgramState]:
        """`run_batch` for async code: at most `concurrency` programs at a time."""
        batch = self._batch_kwargs(batch_kwargs)
        if not batch:
            return []
        defaults = _sampling_defaults(sampling)
        be = await _aresolve(backend)
        loop, template = await self._prepare_async(be)
        prefix = common_prefix(self.func, batch, template) if len(batch) > 1 else ""
        if prefix:
            await call_async(loop, lambda: be.cache_prefix(prefix))
        bar = _bar(len(batch), progress_bar)
        gate = asyncio.Semaphore(max(1, concurrency))
        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(concurrency, len(batch))))
        here = asyncio.get_running_loop()

        async def one(kw: dict[str, Any]) -> ProgramState:
            async with gate:
                prog = Program(be, loop, defaults, template, False)
                await here.run_in_executor(pool, prog.run_body, self.func, kw)
                await asyncio.wrap_future(prog.finished)
                _settle(prog)
                if bar is not None:
                    bar.update(1)
                return prog.state

        try:
            return list(await asyncio.gather(*(one(kw) for kw in batch)))
        finally:
            pool.shutdown(wait=False)
            if bar is not None:
                bar.close()


def _settle(prog: Program) -> None:
    err = prog.error()
    if err is not None and prog.state._exec.error is None:
        prog.state._exec.error = err


async def _aresolve(backend: Any) -> Backend:
    if backend is None:
        from radixserve.lang.defaults import get_default_backend

        default = get_default_backend()
        if default is None:  # starting the embedded model takes seconds: not on the loop
            return await asyncio.to_thread(resolve_backend, None)
        return default
    return resolve_backend(backend)


_background: set[Any] = set()


def _keep(fut: Any) -> None:
    _background.add(fut)
    fut.add_done_callback(_background.discard)


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="programs")


def function(func: Callable[..., Any] | None = None, **_: Any) -> Any:
    """Decorator: `@function def prog(s, question): ...` (also `@function()`)."""
    if func is not None:
        return SglFunction(func)
    return SglFunction
