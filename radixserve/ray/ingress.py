"""The ingress of a Ray Serve application: `create_app`'s routes over an `AsyncEngine` whose
core is `ServeReplicas`.

`ServeReplicas` is an `EngineCore` (engine.py) over the engine replicas'
deployment handle, so the app is the very one `radixserve serve` runs (OpenAI-compatible
and native routes, metrics). It prepares each request as one engine would
(with the tokenizer the replicas load, whose files one of them sends at start)
and calls a replica with token ids; Ray Serve's request router (`router.py`)
picks the replica. `abort` and the maintenance calls go to every replica (the
handle's `broadcast`); `stats()` sums theirs. Replica health is Ray Serve's:
a replica whose engine failed fails its health check and is replaced.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from radixserve.chat_output import ChatRewriter
from radixserve.chat_plan import ChatOptions, ChatParsers
from radixserve.config import EngineConfig
from radixserve.constrained.cache import GrammarCache
from radixserve.engine import AsyncEngine
from radixserve.errors import WRONG_LOOP
from radixserve.model.tokenizer import load_tokenizer
from radixserve.outputs import RequestOutput
from radixserve.prompts import Prompt
from radixserve.ray.deltas import DeltaJoiner
from radixserve.ray.replica import ReplicaInfo
from radixserve.replicas.prepare import check_ids, prepare_request, rewrite_result
from radixserve.sampling_params import SamplingParams
from radixserve.server.app import LOOPBACK_HOSTS, create_app
from radixserve.server.limits import ServerLimits

MAINTENANCE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServerOptions:
    """`create_app`'s options for the ingress."""

    api_key: str | None = None
    model_name: str | None = None
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    cors_origins: tuple[str, ...] = ()
    limits: ServerLimits = field(default_factory=ServerLimits)


class ServeReplicas:
    """The `EngineCore` of an `AsyncEngine` over Ray Serve replicas (see the module docstring)."""

    # One engine's parts: the replicas have them, in processes of their own.
    loaded: None = None
    scheduler: None = None
    pool: None = None
    worker: None = None

    def __init__(self, config: EngineConfig, replicas: DeploymentHandle) -> None:
        self.config = config
        self._handle = replicas
        self._live: set[str] = set()  # request ids running
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tokenizer: Any = None
        self._parsers: ChatParsers | None = None
        self._vocab = 0
        self.context_length = 0

    async def start(self) -> None:
        """Learn the model from one replica (its context, vocabulary and tokenizer files)."""
        if self._loop is None:
            info: ReplicaInfo = await self._handle.info.remote()
            self.context_length, self._vocab = info.context_length, info.vocab_size
            if info.tokenizer_files:
                folder = Path(tempfile.mkdtemp(prefix="radixserve-tokenizer-"))
                for name, data in info.tokenizer_files.items():
                    (folder / name).write_bytes(data)
                tok = self._tokenizer = load_tokenizer(folder)
                cfg = self.config
                self._parsers = ChatParsers.resolve(cfg.tool_call_parser, cfg.reasoning_parser, tok)
            self._loop = asyncio.get_running_loop()

    async def shutdown(self, drain: bool = True) -> None:
        """Nothing to stop here: Ray Serve owns the replicas (`serve.shutdown()`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def healthy(self) -> bool:
        return self._loop is not None

    @property
    def chat_parsers(self) -> ChatParsers | None:
        return self._parsers

    @property
    def tokenizer(self) -> Any:  # as AsyncEngine.tokenizer
        return self._tokenizer

    @property
    def grammar_cache(self) -> GrammarCache | None:
        return None  # each replica compiles and keeps its own

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> AsyncGenerator[RequestOutput, None]:
        ids, params, rewrite = self._prepare(prompt, params or SamplingParams(), options)
        self._claim(request_id, extra_key)
        call = dict(ids=ids, params=params, request_id=request_id, extra_key=extra_key)
        stream = self._handle.options(stream=True)
        outs = cast(DeploymentResponseGenerator[RequestOutput], stream.generate.remote(**call))
        ended = False
        join = DeltaJoiner()  # the replica sends deltas only (ray/deltas.py)
        try:
            async for delta in outs:
                out = join(delta)
                yield out if rewrite is None else rewrite(out)
            ended = True
        finally:
            if request_id is not None:
                self._live.discard(request_id)
            if not ended:  # a cancel, a break: the replica's generator is closed, its request aborted
                outs.cancel()

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        *,
        request_id: str | None,
        extra_key: str | None,
        options: ChatOptions,
    ) -> RequestOutput | list[RequestOutput]:
        ids, params, rewrite = self._prepare(prompt, params or SamplingParams(), options)
        self._claim(request_id, extra_key)
        call = dict(ids=ids, params=params, request_id=request_id, extra_key=extra_key)
        response = self._handle.complete.remote(**call)
        try:
            result: RequestOutput | list[RequestOutput] = await response
        except asyncio.CancelledError:
            response.cancel()
            raise
        finally:
            if request_id is not None:
                self._live.discard(request_id)
        return rewrite_result(rewrite, result)

    async def abort(self, request_id: str) -> None:
        """Abort the live request `request_id` on whichever replica runs it."""
        self._check_loop()
        if request_id in self._live:
            await self._each("abort", request_id)

    async def flush_cache(self) -> bool:
        return all(await self._each("flush_cache"))

    async def check_integrity(self) -> None:
        await self._each("check_integrity")

    async def stats(self) -> dict[str, int | float]:
        """Every replica's counters summed, and `replicas` (how many answered)."""
        total: dict[str, int | float] = {}
        answers = await self._each("stats")
        for stats in answers:
            for key, value in stats.items():
                total[key] = total.get(key, 0) + value
        total["replicas"] = len(answers)
        return total

    def check_alive(self) -> None:
        self._check_loop()
        if self._loop is None:
            raise RuntimeError("the engine is not running: `await engine.start()` first")

    # ---- internals -----------------------------------------------------------------------

    async def _each(self, method: str, *args: object) -> list[Any]:
        """`method` on every running replica, at once."""
        self.check_alive()
        calls = self._handle.broadcast(method, *args)
        return await calls.results_async(timeout_s=MAINTENANCE_TIMEOUT_S)

    def _prepare(
        self, prompt: Prompt, params: SamplingParams, options: ChatOptions
    ) -> tuple[list[int], SamplingParams, ChatRewriter | None]:
        self.check_alive()
        return prepare_request(
            self._tokenizer, self._parsers, self.context_length, self._vocab, prompt, params, options
        )

    def _claim(self, request_id: str | None, extra_key: str | None) -> None:
        check_ids(request_id, extra_key, self._live)
        if request_id is not None:
            self._live.add(request_id)

    def _check_loop(self) -> None:
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(WRONG_LOOP)


class Ingress:
    """The ingress deployment: `create_app` over an `AsyncEngine` of `ServeReplicas` (Ray Serve
    asks for the app once `__init__` has run: `__serve_build_asgi_app__`)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits it
        self, replicas: DeploymentHandle, config: EngineConfig, server: ServerOptions
    ) -> None:
        self.engine = await AsyncEngine.over(ServeReplicas(config, replicas)).start()
        self.server = server

    def __serve_build_asgi_app__(self) -> Any:  # a FastAPI app
        s = self.server
        return create_app(
            self.engine,
            api_key=s.api_key,
            limits=s.limits,
            model_name=s.model_name,
            allowed_hosts=s.allowed_hosts,
            cors_origins=s.cors_origins,
        )
