"""What every generating route does around the engine: tokenize and size-check the prompt,
admit it through the gate, and stop work for a client that has gone.

Shared by the OpenAI-compatible and the SGLang-native routers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request

from radixserve.prompts import is_chat, tokenize_prompt
from radixserve.server.errors import APIError
from radixserve.server.limits import Ticket

if TYPE_CHECKING:
    from radixserve.engine import AsyncEngine

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready (nothing is sent back)."""


def engine_of(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    if not engine.healthy:
        raise APIError(503, "the engine is not running", code="engine_unavailable")
    return engine


def admit(request: Request, weight: int = 1) -> Ticket:
    """A place in the gate for `weight` completions, or a 503 when the server is full."""
    return request.app.state.gate.enter(weight)  # type: ignore[no-any-return]


def encode_prompt(
    request: Request, engine: AsyncEngine, prompt: str | Sequence[dict[str, Any]] | Sequence[int]
) -> list[int]:
    """Token ids of a text, chat messages (with the chat template) or ids, within the limits."""
    param = "messages" if is_chat(prompt) else "prompt"
    try:
        ids = tokenize_prompt(engine.tokenizer, prompt)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param=param) from e
    limit = request.app.state.settings.limits.max_prompt_tokens
    if limit is not None and len(ids) > limit:
        raise APIError(
            400, f"the prompt has {len(ids)} tokens, more than this server's limit of {limit}", param="prompt"
        )
    if len(ids) >= engine.context_length:
        raise APIError(
            400,
            f"the prompt has {len(ids)} tokens; the model's context is {engine.context_length} tokens "
            "(the prompt plus at least one generated token must fit)",
            param=param,
            code="context_length_exceeded",
        )
    return ids


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (which aborts its engine request) if the client leaves first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    gone = False
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        gone = task not in done
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)  # both settled, nothing dangling
    if gone:
        raise ClientGone()
    return task.result()
