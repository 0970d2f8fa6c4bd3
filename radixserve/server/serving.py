"""What every generating route does around the engine: tokenize and size-check the prompt,
admit it through the gate, and stop work for a client that has gone.

A prompt is measured before it is tokenized (characters against
`max_prompt_chars`, token ids against the context), and a large one is
tokenized in a worker thread: the tokenizer (Rust) releases the GIL, so the
event loop keeps serving other clients meanwhile.

Shared by the OpenAI-compatible and the SGLang-native routers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread
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


# Tokenizing this many characters takes about a millisecond; past it, a thread is cheaper.
OFFLOAD_CHARS = 4096


def prompt_chars(prompt: object) -> int:
    """Characters of text in a prompt: the string, or every text of chat messages; 0 for ids."""
    if isinstance(prompt, str):
        return len(prompt)
    if not is_chat(prompt):
        return 0
    assert isinstance(prompt, Sequence)
    total = 0
    for message in prompt:
        content = message.get("content") if isinstance(message, Mapping) else None
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, Mapping) else part
            total += len(text) if isinstance(text, str) else 0
    return total


async def encode_prompt(
    request: Request,
    engine: AsyncEngine,
    prompt: str | Sequence[dict[str, Any]] | Sequence[int],
    param: str | None = None,
    tokenize: Callable[[Any, Any], list[int]] = tokenize_prompt,
) -> list[int]:
    """Token ids of a text, chat messages (with the chat template) or ids, within the limits;
    `tokenize` (the tokenizer, the prompt) for prompts already rendered (a chat's text)."""
    param = param or ("messages" if is_chat(prompt) else "prompt")
    limits = request.app.state.settings.limits
    chars = prompt_chars(prompt)
    if chars > limits.max_prompt_chars:
        raise APIError(
            400,
            f"the prompt has {chars} characters, more than this server's limit of "
            f"{limits.max_prompt_chars} (max_prompt_chars)",
            param=param,
            code="prompt_too_long",
        )
    if not isinstance(prompt, str) and not is_chat(prompt):
        _check_length(request, engine, len(prompt), param)  # ids: too many is known before validating
    try:
        if chars > OFFLOAD_CHARS or len(prompt) > OFFLOAD_CHARS:
            async with request.app.state.tokenize_slots:  # CPU left for the engine's worker
                ids = await anyio.to_thread.run_sync(tokenize, engine.tokenizer, prompt)
        else:
            ids = tokenize(engine.tokenizer, prompt)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param=param) from e
    _check_length(request, engine, len(ids), param)
    return ids


def _check_length(request: Request, engine: AsyncEngine, n: int, param: str) -> None:
    limit = request.app.state.settings.limits.max_prompt_tokens
    if limit is not None and n > limit:
        raise APIError(
            400, f"the prompt has {n} tokens, more than this server's limit of {limit}", param="prompt"
        )
    if n >= engine.context_length:
        raise APIError(
            400,
            f"the prompt has {n} tokens; the model's context is {engine.context_length} tokens "
            "(the prompt plus at least one generated token must fit)",
            param=param,
            code="context_length_exceeded",
        )


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
