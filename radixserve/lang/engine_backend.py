"""The in-process backend: a program's calls go straight to an `AsyncEngine`.

It takes an `AsyncEngine` or a blocking `Engine` (whose loop thread then runs
the program's tasks). Prompts go to the engine as token ids that this backend
tokenizes, so `select` knows exactly where the prefix ends and the choice begins.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from radixserve.blocking import Engine
from radixserve.engine import AsyncEngine
from radixserve.lang.backend import (
    DTYPE_REGEX,
    Backend,
    ChoiceLogprobs,
    GenParams,
    GenResult,
    StreamChunk,
    common_prefix,
)
from radixserve.lang.chat_template import ChatTemplate, template_from_tokenizer
from radixserve.outputs import RequestOutput
from radixserve.sampling_params import SamplingParams

_STRUCTURED = ("regex", "json_schema", "ebnf")


class EngineBackend(Backend):
    def __init__(self, engine: AsyncEngine | Engine, owned: bool = False) -> None:
        if isinstance(engine, Engine):
            self.blocking: Engine | None = engine
            self.engine = engine.engine
        elif isinstance(engine, AsyncEngine):
            self.blocking, self.engine = None, engine
        else:
            raise TypeError(
                f"a backend is an AsyncEngine, an Engine or a Backend, not {type(engine).__name__}"
            )
        self.owned = owned  # created by the language itself (the default model): closed by close()
        self._template: ChatTemplate | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.engine.loop

    async def start(self) -> None:
        if not self.engine.healthy:
            await self.engine.start()

    async def chat_template(self) -> ChatTemplate:
        if self._template is None:
            self._template = template_from_tokenizer(self.engine.tokenizer)
        return self._template

    # ---- requests ------------------------------------------------------------------------

    def _ids(self, text: str) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer: the frontend language needs one")
        return list(tok.encode(text, add_special_tokens=True))

    def sampling_params(self, p: GenParams) -> SamplingParams:
        kw: dict[str, Any] = dict(
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            n=p.n,
            stop=p.stop,
            stop_token_ids=p.stop_token_ids,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            min_p=p.min_p,
            frequency_penalty=p.frequency_penalty,
            presence_penalty=p.presence_penalty,
            repetition_penalty=p.repetition_penalty,
            ignore_eos=p.ignore_eos,
            seed=p.seed,
            logprobs=p.return_logprob or p.top_logprobs_num > 0,
            top_logprobs=p.top_logprobs_num,
        )
        if p.logprob_start_len is not None:
            kw.update(prompt_logprobs=True, prompt_logprobs_start=p.logprob_start_len)
        for name in _STRUCTURED:
            if getattr(p, name) is not None:
                kw[name] = getattr(p, name)
        if p.dtype is not None:
            kw["regex"] = DTYPE_REGEX[p.dtype]
        return SamplingParams(**kw)

    async def generate(self, prompt: str, params: GenParams) -> list[GenResult]:
        sp = self.sampling_params(params)
        out = await self.engine.complete(self._ids(prompt), sp)
        outs = out if isinstance(out, list) else [out]
        for o in outs:
            if o.finish_reason == "abort":
                raise RuntimeError(f"the request failed: {o.error or 'aborted'}")
        return [GenResult(o.text, meta_info(o)) for o in outs]

    async def stream(self, prompt: str, params: GenParams) -> AsyncIterator[StreamChunk]:
        if params.n != 1:
            raise ValueError("streaming needs n=1")
        sp = self.sampling_params(params)
        agen = self.engine.generate(self._ids(prompt), sp)
        try:
            async for o in agen:
                if o.finish_reason == "abort":
                    raise RuntimeError(f"the request failed: {o.error or 'aborted'}")
                yield StreamChunk(o.delta_text, o.finished, meta_info(o))
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    async def cache_prefix(self, prefix: str) -> dict[str, Any]:
        out = await self.engine.complete(self._ids(prefix), SamplingParams(max_tokens=0))
        return meta_info(_one(out))

    async def score_choices(
        self, prefix: str, choices: Sequence[str], unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        tok = self.engine.tokenizer
        pids = self._ids(prefix)
        fulls = [self._ids(prefix + c) for c in choices]
        starts = [common_prefix(pids, f) for f in fulls]
        for c, f, s in zip(choices, fulls, starts):
            if s >= len(f) or s == 0:
                raise ValueError(f"select: choice {c!r} adds no token after the prompt")
        # The prefix once into the cache, then every choice reads it from there.
        _one(await self.engine.complete(pids, SamplingParams(max_tokens=0)))
        score = SamplingParams(max_tokens=0, prompt_logprobs=True, prompt_logprobs_start=0)
        outs = await asyncio.gather(
            *(self.engine.complete(f, score.replace(prompt_logprobs_start=s)) for f, s in zip(fulls, starts))
        )
        for c, f, s, o in zip(choices, fulls, starts, outs):
            # Every token of the choice is scored (a short count would bias its mean).
            got = len(_one(o).prompt_logprobs)
            if got != len(f) - s:
                raise RuntimeError(f"select: choice {c!r} got {got} logprobs for {len(f) - s} tokens")
        uncond: list[Any] = [None] * len(choices)
        if unconditional:  # each choice alone; its first token has nothing to be scored on
            alone = [f[s:] for f, s in zip(fulls, starts)]
            first = score.replace(prompt_logprobs_start=1)
            uouts = await asyncio.gather(*(self.engine.complete(a, first) for a in alone))
            uncond = [[(0.0, a[0], tok.decode([a[0]])), *_lps(_one(u), tok)] for a, u in zip(alone, uouts)]
        return [ChoiceLogprobs(_lps(_one(o), tok), u, meta_info(_one(o))) for o, u in zip(outs, uncond)]

    async def flush_cache(self) -> bool:
        return await self.engine.flush_cache()

    async def close(self) -> None:
        if self.owned and self.blocking is not None:
            await asyncio.to_thread(self.blocking.close)


def _one(o: RequestOutput | list[RequestOutput]) -> RequestOutput:
    """The single output of an n=1 request, which must not have failed."""
    assert isinstance(o, RequestOutput)
    if o.finish_reason == "abort":
        raise RuntimeError(f"the request failed: {o.error or 'aborted'}")
    return o


def _lps(o: RequestOutput, tok: Any) -> list[tuple[float, int, str | None]]:
    return [(t.logprob, t.token_id, tok.decode([t.token_id])) for t in o.prompt_logprobs]


def meta_info(o: RequestOutput) -> dict[str, Any]:
    """SGLang-style meta_info of one finished output."""
    finish: dict[str, Any] | None = None
    if o.finish_reason is not None:
        finish = {"type": o.finish_reason}
        if o.finish_reason == "stop":
            finish["matched"] = o.stop_reason
        elif o.finish_reason == "length":
            finish["length"] = o.usage.completion_tokens
        elif o.error:
            finish["message"] = o.error
    meta: dict[str, Any] = {
        "id": o.request_id,
        "prompt_tokens": o.usage.prompt_tokens,
        "completion_tokens": o.usage.completion_tokens,
        "cached_tokens": o.usage.cached_tokens,
        "finish_reason": finish,
    }
    if o.logprobs:
        meta["output_token_logprobs"] = [(t.logprob, t.token_id, None) for t in o.logprobs]
        meta["output_top_logprobs"] = [[(lp, i, None) for i, lp in t.top] for t in o.logprobs]
    if o.prompt_logprobs:
        meta["input_token_logprobs"] = [(t.logprob, t.token_id, None) for t in o.prompt_logprobs]
    return meta
