"""A caller's prompt and `SamplingParams` turned into validated `Request`s (event loop).

Everything a caller can get wrong raises here, in the caller, so a bad
request never reaches the worker.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from radixserve.model.loader import LoadedModel
from radixserve.outputs import RequestOutput
from radixserve.prompts import Prompt, tokenize_prompt
from radixserve.sampling_params import SamplingParams
from radixserve.sched.request import Request


def make_requests(
    loaded: LoadedModel,
    context_length: int,
    prompt: Prompt,
    params: SamplingParams,
    request_id: str | None,
    extra_key: str | None,
    new_key: Callable[[str], str],
    arrival: itertools.count[int],
) -> list[Request]:
    """One `Request` per completion (`params.n`), all under the submission key `new_key` gives."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    ids = tokenize_prompt(loaded.tokenizer, prompt)
    check_prompt_ids(ids, context_length, loaded.config.vocab_size)
    params.check_vocab(loaded.config.vocab_size)
    rid = request_id or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise TypeError(f"request_id must be a str, got {type(rid).__name__}")
    if extra_key is not None and not isinstance(extra_key, str):
        raise TypeError(f"extra_key must be a str or None, got {type(extra_key).__name__}")
    rid = new_key(rid)
    eos = frozenset(loaded.eos_token_ids or loaded.config.eos_token_ids)
    reqs = []
    for i in range(params.n):
        # Completions of one seeded request differ from each other but not between runs.
        p = params if params.n == 1 or params.seed is None else replace(params, seed=params.seed + i, n=1)
        reqs.append(Request(rid, i, list(ids), p, eos, context_length, extra_key, arrival=next(arrival)))
    return reqs


def check_prompt_ids(ids: list[int], context_length: int, vocab: int) -> None:
    """ValueError unless `ids` is a prompt the engine can run (also the replicas' router's check)."""
    if not ids:
        raise ValueError("the prompt is empty")
    if len(ids) >= context_length:
        raise ValueError(
            f"the prompt has {len(ids)} tokens; the context is {context_length} tokens "
            "(the prompt plus at least one generated token must fit)"
        )
    if max(ids) >= vocab or min(ids) < 0:
        raise ValueError(f"input_ids must be token ids in [0, {vocab})")


Result = RequestOutput | list[RequestOutput]


async def complete_many(
    complete: Callable[[Prompt, SamplingParams | None], Awaitable[Result]],
    prompts: Sequence[Prompt],
    params: SamplingParams | Sequence[SamplingParams] | None,
    progress: bool,
) -> list[Result]:
    """`complete` of every prompt concurrently, results in prompt order (`generate_many`)."""
    plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    if len(plist) != len(prompts):
        raise ValueError(f"generate_many: {len(prompts)} prompts but {len(plist)} SamplingParams")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), desc="radixserve")

    async def one(p: Prompt, sp: SamplingParams | None) -> Result:
        res = await complete(p, sp)
        if bar is not None:
            bar.update(1)
        return res

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
