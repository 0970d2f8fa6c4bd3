"""What every generating route does around the engine: tokenize and size-check the prompt,
admit it through the gate, and stop work for a client that has gone.

Shared by the OpenAI-compatible and the SGLang-native routers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request

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
    tok = engine.tokenizer
    if isinstance(prompt, str):
        if tok is None:
            raise APIError(400, "this model has no tokenizer: send token ids", param="prompt")
        ids = list(tok.encode(prompt, add_special_tokens=True))
    elif prompt and isinstance(prompt[0], dict):
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError(400, "this model has no chat template", param="messages")
        try:
            text = tok.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template that rejects this conversation (e.g. roles out of order)
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages") from e
        ids = list(tok.encode(text, add_special_tokens=False))
    else:
        ids = [int(t) for t in prompt]  # type: ignore[arg-type]
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
            param="messages"
            if prompt and not isinstance(prompt, str) and isinstance(prompt[0], dict)
            else "prompt",
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
