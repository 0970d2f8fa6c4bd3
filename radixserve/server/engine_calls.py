"""Running one HTTP request's prompts on the engine: all final outputs, or one merged stream.

A request may carry several prompts (a batched `/v1/completions`); each is one
engine request with its n completions. Errors cancel the siblings, and closing
the merged stream aborts every engine request still running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from radixserve.outputs import RequestOutput
from radixserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixserve.engine import AsyncEngine


async def complete_all(
    engine: AsyncEngine, prompts: Sequence[list[int]], params: SamplingParams
) -> list[list[RequestOutput]]:
    """The n final outputs of every prompt, in order; the first error cancels the rest."""

    async def one(ids: list[int]) -> list[RequestOutput]:
        res = await engine.complete(ids, params)
        return res if isinstance(res, list) else [res]

    tasks = [asyncio.ensure_future(one(p)) for p in prompts]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_all(
    engine: AsyncEngine, prompts: Sequence[list[int]], params: SamplingParams
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) as they come, across all prompts, until every completion ends."""
    if len(prompts) == 1:
        async with contextlib.aclosing(engine.generate(prompts[0], params)) as gen:  # type: ignore[type-var]
            async for out in gen:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def pump(k: int, ids: list[int]) -> None:
        try:
            async with contextlib.aclosing(engine.generate(ids, params)) as gen:  # type: ignore[type-var]
                async for out in gen:
                    queue.put_nowait((k, out))
            queue.put_nowait(None)
        except Exception as e:
            queue.put_nowait(e)

    tasks = [asyncio.ensure_future(pump(k, p)) for k, p in enumerate(prompts)]
    try:
        ended = 0
        while ended < len(tasks):
            item = await queue.get()
            if item is None:
                ended += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
