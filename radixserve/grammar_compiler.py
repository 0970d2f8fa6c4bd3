"""The engine's side of structured output: compile a request's grammar, give it matchers.

The backend (xgrammar) and its `GrammarCache` are built on the first
constrained request, so unconstrained engines never import xgrammar. This
module joins `constrained/` (which knows no engine, model or request) to the
engine's config, its loaded model and its `Request`s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from radixserve.config import EngineConfig
from radixserve.constrained.base import GrammarBackend
from radixserve.constrained.cache import GrammarCache
from radixserve.model.loader import LoadedModel
from radixserve.model.text_tokenizer import transformers_tokenizer
from radixserve.sampling_params import SamplingParams
from radixserve.sched.request import Request


class GrammarCompiler:
    def __init__(self, config: EngineConfig, make_backend: Callable[[], GrammarBackend]) -> None:
        self.config = config
        self._make_backend = make_backend  # runs in a thread, once
        self.cache: GrammarCache | None = None
        self._lock: asyncio.Lock | None = None

    async def compile(self, params: SamplingParams) -> Any:  # Any: the backend's compiled grammar
        """The compiled grammar of `params` (None if unconstrained), compiled in a thread
        while this request waits outside the batch; ValueError if it does not compile."""
        spec = params.grammar if isinstance(params, SamplingParams) else None
        if spec is None:
            return None
        if self.cache is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self.cache is None:
                    backend = await asyncio.to_thread(self._make_backend)
                    cfg = self.config
                    self.cache = GrammarCache(
                        backend,
                        capacity=cfg.grammar_cache_size,
                        timeout_s=cfg.grammar_compile_timeout,
                        max_bytes=cfg.grammar_cache_bytes,
                        workers=cfg.grammar_compile_workers,
                        max_abandoned=cfg.grammar_max_abandoned,
                    )
        return await self.cache.get(spec)

    def close(self) -> None:
        """Engine shutdown: refuse new compiles, never wait for running ones. The backend
        belongs to the model being dropped, so a restarted engine builds a new cache."""
        cache, self.cache = self.cache, None
        if cache is not None:
            cache.close()

    def attach(self, reqs: list[Request], compiled: Any) -> None:
        if compiled is None:
            return
        assert self.cache is not None
        for r in reqs:  # one matcher per completion
            r.grammar = self.cache.backend.matcher(compiled)

    def backend_now(self) -> GrammarBackend:  # worker thread: set before any matcher exists
        assert self.cache is not None
        return self.cache.backend


def xgrammar_backend(loaded: LoadedModel | None) -> GrammarBackend:
    """The backend of a loaded model (imports xgrammar); called after the engine started."""
    if loaded is None:
        raise RuntimeError("structured output needs a started engine")
    from radixserve.constrained.xgrammar_backend import XGrammarBackend

    eos = loaded.eos_token_ids or loaded.config.eos_token_ids
    # xgrammar reads transformers' tokenizer
    return XGrammarBackend(transformers_tokenizer(loaded.tokenizer), loaded.config.vocab_size, eos)
