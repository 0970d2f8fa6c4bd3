"""`Replica`: what a `ReplicaSet` needs of each of its engines (`AsyncEngine`, which the
replicas package sits below, so it names the part it uses instead of importing it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from radixserve.chat_plan import ChatParsers
from radixserve.config import EngineConfig
from radixserve.constrained.cache import GrammarCache
from radixserve.model.loader import LoadedModel
from radixserve.outputs import RequestOutput
from radixserve.prompts import Prompt
from radixserve.sampling_params import SamplingParams


class Replica(Protocol):
    @property
    def config(self) -> EngineConfig: ...

    @property
    def loaded(self) -> LoadedModel | None: ...

    @property
    def context_length(self) -> int: ...

    async def start(self) -> object: ...

    async def shutdown(self, drain: bool = ...) -> None: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def chat_parsers(self) -> ChatParsers | None: ...

    @property
    def tokenizer(self) -> Any: ...  # as AsyncEngine.tokenizer

    @property
    def grammar_cache(self) -> GrammarCache | None: ...

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = ...,
        *,
        request_id: str | None = ...,
        extra_key: str | None = ...,
    ) -> AsyncIterator[RequestOutput]: ...

    async def complete(
        self,
        prompt: Prompt,
        params: SamplingParams | None = ...,
        *,
        request_id: str | None = ...,
        extra_key: str | None = ...,
    ) -> RequestOutput | list[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    async def flush_cache(self) -> bool: ...

    async def check_integrity(self) -> None: ...

    async def stats(self) -> dict[str, int | float]: ...
