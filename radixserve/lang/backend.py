"""The backend interface of the frontend language: what a program needs from a model.

Two implementations: the in-process engine (`engine_backend.py`, the default)
and an HTTP client of a radixserve/SGLang server. The interpreter only ever
calls these coroutines; it builds the prompt text itself (roles come from
`chat_template()`), so a backend deals in plain text prompts.

Every coroutine runs on `backend.loop` when that is not None (an engine
belongs to the event loop it started in); with `loop is None` the backend
works on any running loop.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve.lang.chat_template import ChatTemplate

# One token's logprob as SGLang's meta_info reports it: (logprob, token id, text or None).
TokenLogprob = tuple[float, int, str | None]


@dataclass(frozen=True)
class GenParams:
    """Sampling for one `gen` call, resolved (run()'s defaults, then gen's own values)."""

    max_tokens: int = 128
    min_tokens: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None  # prompt logprobs from this position (None: none)
    top_logprobs_num: int = 0
    # Structured output (at most one); a backend without it raises NotImplementedError.
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    # "int", "float", "str" or "bool" (gen(dtype=...)): the backend constrains the text to
    # that form (a regex where it has structured output) or raises NotImplementedError.
    dtype: str | None = None


@dataclass(frozen=True)
class GenResult:
    """One completion. `meta_info` (SGLang's shape) has at least prompt_tokens,
    completion_tokens, cached_tokens and finish_reason ({"type": "stop", "matched": ...},
    {"type": "length", "length": n}); with return_logprob also output_token_logprobs
    and output_top_logprobs, with logprob_start_len input_token_logprobs (TokenLogprob
    lists). A failed request raises instead of returning {"type": "abort"}."""

    text: str
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamChunk:
    """A piece of one streamed completion; the last one has finished=True. `meta_info`: the
    completion's meta_info so far (SGLang's shape, cumulative: completion_tokens, and the
    output logprobs of every token up to this piece when asked); the last one's is final."""

    text: str
    finished: bool
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChoiceLogprobs:
    """How likely one continuation is after a prefix.

    `token_logprobs`: the continuation's tokens, each given the prefix and the tokens
    before it. `unconditional`: the same tokens scored without the prefix (only when
    asked). `meta_info`: the scoring request's usage (prompt_tokens, cached_tokens)."""

    token_logprobs: list[TokenLogprob]
    unconditional: list[TokenLogprob] | None = None
    meta_info: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """What the interpreter calls. Keep it small: an HTTP backend implements the same."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this backend's coroutines must run on (None: any loop)."""
        return None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Called once on the backend's loop before first use (idempotent)."""

    @abstractmethod
    async def chat_template(self) -> ChatTemplate:
        """The role prefixes/suffixes used by system()/user()/assistant()."""

    @abstractmethod
    async def generate(self, prompt: str, params: GenParams) -> list[GenResult]:
        """`params.n` completions of `prompt`, by index."""

    @abstractmethod
    def stream(self, prompt: str, params: GenParams) -> AsyncIterator[StreamChunk]:
        """One completion (`params.n == 1`), piece by piece; leaving early aborts it."""

    @abstractmethod
    async def score_choices(
        self, prefix: str, choices: Sequence[str], unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        """Logprobs of each `prefix + choice` continuation, the prefix computed once."""

    @abstractmethod
    async def cache_prefix(self, prefix: str) -> dict[str, Any]:
        """Prefill `prefix` into the prefix cache (no generation); returns its meta_info."""

    @abstractmethod
    async def flush_cache(self) -> bool:
        """Empty the prefix cache; False when it could not (requests running)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend started (an engine it created itself)."""


# Regexes of gen(dtype=...) where structured output exists (SGLang's forms); shared by the
# backends (this module imports no torch, so the HTTP backend can use it).
DTYPE_REGEX = {
    "int": r"[-+]?[0-9]+",
    "float": r"[-+]?[0-9]*\.?[0-9]+",
    "str": r"\"[\w\d\s]*\"",
    "bool": r"(True|False)",
}


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
