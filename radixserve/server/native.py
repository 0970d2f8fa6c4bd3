"""SGLang's native HTTP API over `app.state.engine`, so SGLang clients work unchanged.

`/generate` (POST or PUT) takes `text` or `input_ids`, one prompt or a list,
SGLang's `sampling_params`, logprob options and `stream`; it answers
`{"text", "output_ids", "meta_info"}` (a list for a batch or `n > 1`), or with
`stream` server-sent events of cumulative text ending in `data: [DONE]`.
The other native endpoints are in `native_admin.py`. Errors are 4xx/5xx with
`{"error": {"message", ...}}`; a request never leaves work behind: a client that
disconnects aborts its requests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from radixserve.outputs import RequestOutput
from radixserve.server.body import JSONRoute
from radixserve.server.errors import APIError, bad_request, error_response
from radixserve.server.limits import Ticket
from radixserve.server.metrics import Tracker
from radixserve.server.native_admin import router as admin_router
from radixserve.server.native_output import MetaBuilder, TokenTexts
from radixserve.server.native_protocol import GenerateReqInput, Item, NativeError, resolve
from radixserve.server.serving import ClientGone, admit, encode_prompt, engine_of, unless_disconnected

if TYPE_CHECKING:
    from radixserve.engine import AsyncEngine

router = APIRouter(tags=["sglang-native"], route_class=JSONRoute)


def _failure(e: BaseException) -> JSONResponse:
    """The answer for an exception out of request handling (a per-request error, never a crash)."""
    if isinstance(e, APIError):
        return error_response(e.status, e.message, e.param, e.code)
    if isinstance(e, NativeError):
        return error_response(e.status, str(e), code=e.code)
    if isinstance(e, (ValueError, TypeError)):
        err = bad_request(e)
        return error_response(err.status, err.message, err.param)
    return error_response(503, f"the engine cannot serve requests: {e}")


class _Completion:
    """One prompt of a request, tokenized, with the builders of its n answers."""

    def __init__(
        self, item: Item, ids: list[int], first_index: int, texts: TokenTexts, tracker: Tracker
    ) -> None:
        self.item = item
        self.ids = ids
        self.first_index = first_index
        self.tracker = tracker  # the app's metrics of this engine request
        n = item.params.n
        names = [item.rid] if n == 1 else [f"{item.rid}_{j}" for j in range(n)]
        self.meta = [MetaBuilder(item, ids, name, texts) for name in names]


async def _prepare(request: Request, engine: AsyncEngine, body: Any) -> tuple[list[_Completion], bool, bool]:
    """Validated completions, whether the answer is a list, and whether to stream."""
    if not isinstance(body, dict):
        raise NativeError("the request body must be a JSON object")
    try:
        req = GenerateReqInput.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise NativeError(f"{where}: {first.get('msg')}" if where else str(first.get("msg"))) from None
    items, batch = resolve(req, request.app.state.settings.limits.max_n)
    out: list[_Completion] = []
    index = 0
    for item in items:
        ids = await encode_prompt(request, engine, item.prompt)
        if not ids:
            raise NativeError("the prompt is empty")
        if item.logprob_start_len > len(ids):
            raise NativeError(
                f"logprob_start_len={item.logprob_start_len} is more than the {len(ids)} prompt tokens"
            )
        out.append(
            _Completion(
                item,
                ids,
                index,
                TokenTexts(engine.tokenizer, req.return_text_in_logprobs),
                request.app.state.metrics.track(),
            )
        )
        index += item.params.n
    return out, batch, req.stream


async def _complete_all(engine: AsyncEngine, comps: list[_Completion]) -> list[RequestOutput]:
    """Every completion's final outputs in answer order; the first failure cancels the rest."""

    async def one(c: _Completion) -> list[RequestOutput]:
        res = await engine.complete(c.ids, c.item.params, request_id=c.item.rid, extra_key=c.item.extra_key)
        return res if isinstance(res, list) else [res]

    tasks = [asyncio.ensure_future(one(c)) for c in comps]
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [o for outs in results for o in outs]


async def _merged(
    engine: AsyncEngine, comps: list[_Completion], ticket: Ticket
) -> AsyncGenerator[tuple[_Completion, RequestOutput], None]:
    """Outputs of every completion as they come; leaving early aborts all of them.

    Closing it (or its garbage collection, for a client gone before the body was
    sent) cancels the engine requests and frees the admission ticket."""
    queue: asyncio.Queue[tuple[_Completion, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def pump(c: _Completion) -> None:
        try:
            async for out in engine.generate(
                c.ids, c.item.params, request_id=c.item.rid, extra_key=c.item.extra_key
            ):
                c.tracker.observe(out)
                queue.put_nowait((c, out))
        except Exception as e:  # handed to the consumer, which answers it
            queue.put_nowait(e)
        finally:
            c.tracker.done()
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(c)) for c in comps]
    try:
        running = len(tasks)
        while running:
            got = await queue.get()
            if got is None:
                running -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield got
    finally:
        for t in tasks:
            t.cancel()
        ticket.release()
        await asyncio.gather(*tasks, return_exceptions=True)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _stream(engine: AsyncEngine, comps: list[_Completion], batch: bool, ticket: Ticket) -> Response:
    events = _merged(engine, comps, ticket)
    try:  # the engine validates on submit, before any output: those errors are a 400, not a stream
        first: tuple[_Completion, RequestOutput] | None = await events.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException as e:
        await events.aclose()
        if not isinstance(e, Exception):
            raise
        return _failure(e)

    async def body() -> AsyncIterator[bytes]:
        try:
            got = first
            while got is not None:
                c, out = got
                index = c.first_index + out.index if batch else None
                yield _sse(c.meta[out.index].answer(out, index))
                got = await events.__anext__()
        except StopAsyncIteration:
            pass
        except Exception as e:  # the engine failed mid-stream: say so, then end the stream
            yield _sse(json.loads(bytes(_failure(e).body)))
        finally:
            await events.aclose()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request) -> Response:
    """SGLang's `/generate`."""
    body = await request.json()  # a BodyError (400) when not JSON or nested too deep
    try:
        engine = engine_of(request)
        comps, batch, stream = await _prepare(request, engine, body)
        ticket = admit(request, sum(c.item.params.n for c in comps))
    except Exception as e:
        return _failure(e)
    if stream:
        return await _stream(engine, comps, batch, ticket)
    try:
        outs = await unless_disconnected(request, _complete_all(engine, comps))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the requests were aborted
    except Exception as e:
        return _failure(e)
    finally:
        ticket.release()
        for c in comps:
            c.tracker.done()
    for c in comps:
        c.tracker.observe_final([o for o in outs if o.request_id == c.item.rid])
    for out in outs:
        if out.finish_reason == "abort":
            return error_response(400, out.error or "the request was aborted")
    by_index = [(c, j) for c in comps for j in range(c.item.params.n)]
    answers = [c.meta[j].answer(out) for (c, j), out in zip(by_index, outs)]
    return JSONResponse(answers if batch else answers[0])


router.include_router(admin_router)
