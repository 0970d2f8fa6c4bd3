"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Each request is tokenized and validated in the handler (a bad one is a 400
before anything reaches the engine), admitted through the gate (503 when
full), then run on the engine: awaited whole, or streamed as Server-Sent
Events ending in `data: [DONE]`. A client that leaves cancels its work, which
aborts the engine request and frees its KV.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixserve.chat_output import ChatRewriter
from radixserve.chat_plan import ChatPlan, plan_chat
from radixserve.engine import AsyncEngine
from radixserve.errors import EngineDeadError
from radixserve.outputs import RequestOutput
from radixserve.prompts import encode_text
from radixserve.sampling_params import SamplingParams
from radixserve.server import openai_format as fmt
from radixserve.server.body import JSONRoute
from radixserve.server.engine_calls import complete_all, stream_all
from radixserve.server.errors import APIError, bad_request, error_body
from radixserve.server.limits import Ticket
from radixserve.server.metrics import Tracker
from radixserve.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from radixserve.server.serving import ClientGone, admit, encode_prompt, engine_of, unless_disconnected

router = APIRouter(route_class=JSONRoute)


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    s = request.app.state.settings
    card = {"id": s.model_name, "object": "model", "created": 0, "owned_by": "radixserve"}
    return {"object": "list", "data": [card]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    _check_model(request, model_id)
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "radixserve"}


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    engine = engine_of(request)
    _check_model(request, body.model)
    plan = _plan(engine, body)
    ids = await encode_prompt(request, engine, plan.prompt, param="messages", tokenize=_encode_rendered)
    limits = request.app.state.settings.limits
    params = body.sampling_params(engine.context_length - len(ids), limits.max_n)
    try:
        params = plan.constrain(params)
    except ValueError as e:
        raise APIError(400, str(e), param="tool_choice") from e
    meta = fmt.Meta.new("chat", request.app.state.settings.model_name)
    return await _serve(request, meta, [ids], params, body.stream, _include_usage(body), plan.rewriter)


def _plan(engine: AsyncEngine, body: ChatCompletionRequest) -> ChatPlan:
    """The chat options checked and the prompt rendered; a 400 names the field."""
    parsers = engine.chat_parsers
    if parsers is None:
        raise APIError(400, "this model has no chat template: use /v1/completions", param="messages")
    try:
        return plan_chat(
            engine.tokenizer,
            parsers,
            body.prompt(),
            tools=body.tools,
            tool_choice=body.tool_choice,
            parallel_tool_calls=body.parallel_tool_calls,
            chat_template_kwargs=body.chat_template_kwargs,
        )
    except (ValueError, TypeError) as e:
        field = re.match(r"[A-Za-z_]+", str(e))
        param = field.group(0) if field else None
        raise APIError(400, str(e), param=param if param in _CHAT_FIELDS else None) from e


_CHAT_FIELDS = ("messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")


def _encode_rendered(tokenizer: Any, text: str) -> list[int]:
    """Ids of a rendered chat prompt: the template wrote its special tokens already."""
    return encode_text(tokenizer, text, add_special_tokens=False)


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    engine = engine_of(request)
    _check_model(request, body.model)
    prompts = [await encode_prompt(request, engine, p) for p in body.prompts()]
    params = body.sampling_params(request.app.state.settings.limits.max_n)
    meta = fmt.Meta.new("text", request.app.state.settings.model_name)
    return await _serve(request, meta, prompts, params, body.stream, _include_usage(body))


def _include_usage(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _check_model(request: Request, model: str) -> None:
    name = request.app.state.settings.model_name
    if model != name:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {name!r}",
            param="model",
            code="model_not_found",
        )


async def _serve(
    request: Request,
    meta: fmt.Meta,
    prompts: list[list[int]],
    params: SamplingParams,
    stream: bool,
    usage: bool,
    rewriter: Callable[[], ChatRewriter | None] | None = None,
) -> Response:
    """Run the prompts; `rewriter` gives each prompt's parser of chat outputs (tool calls, reasoning)."""
    engine = engine_of(request)
    rewriters = [rewriter() if rewriter is not None else None for _ in prompts]
    ticket = admit(request, params.n * len(prompts))
    tracker: Tracker = request.app.state.metrics.track()
    text_of = fmt.TokenText(engine.tokenizer)
    if not stream:
        with ticket:
            try:
                finals = await unless_disconnected(request, complete_all(engine, prompts, params))
            except ClientGone:
                return Response(status_code=499)
            except (ValueError, TypeError) as e:
                raise bad_request(e) from e
            except EngineDeadError as e:
                raise APIError(503, str(e), code="engine_unavailable") from e
            finally:
                tracker.done()
        finals = [[rw(o) for o in outs] if rw else outs for rw, outs in zip(rewriters, finals)]
        tracker.observe_final([o for outs in finals for o in outs])
        for outs in finals:
            for o in outs:
                if o.finish_reason == "abort":
                    raise APIError(500, f"the request was aborted: {o.error or 'no reason given'}")
        n = params.n
        choices = [
            fmt.choice(meta, k * n + o.index, o, params.logprobs, text_of)
            for k, outs in enumerate(finals)
            for o in outs
        ]
        return JSONResponse({**meta.envelope(chunk=False), "choices": choices, "usage": fmt.usage(finals)})
    gen = stream_all(engine, prompts, params)
    try:  # the first output: a prompt the engine rejects is still a plain 400
        first = await unless_disconnected(request, anext(gen))
    except ClientGone:
        ticket.release()
        tracker.done()
        return Response(status_code=499)
    except (ValueError, TypeError) as e:
        ticket.release()
        tracker.done()
        raise bad_request(e) from e
    except BaseException:
        ticket.release()
        tracker.done()
        raise
    events = _events(meta, first, gen, params, len(prompts), usage, ticket, tracker, text_of, rewriters)
    return StreamingResponse(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})


async def _events(
    meta: fmt.Meta,
    first: tuple[int, RequestOutput],
    gen: AsyncIterator[tuple[int, RequestOutput]],
    params: SamplingParams,
    n_prompts: int,
    include_usage: bool,
    ticket: Ticket,
    tracker: Tracker,
    text_of: fmt.TokenText,
    rewriters: list[ChatRewriter | None],
) -> AsyncIterator[str]:
    n = params.n
    head = meta.envelope(chunk=True)
    extra = {"usage": None} if include_usage else {}
    finals: list[list[RequestOutput]] = [[] for _ in range(n_prompts)]
    offsets = [0] * (n * n_prompts)
    try:
        async with contextlib.aclosing(gen):  # type: ignore[type-var]
            if meta.kind == "chat":
                for i in range(n * n_prompts):
                    role = {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    yield fmt.sse({**head, "choices": [role], **extra})
            item: tuple[int, RequestOutput] | None = first
            while item is not None:
                k, out = item
                rw = rewriters[k]
                if rw is not None:
                    out = rw(out)
                tracker.observe(out)
                if out.finish_reason == "abort":
                    yield fmt.sse(
                        error_body(500, f"the request was aborted: {out.error or 'no reason given'}")
                    )
                    return
                i = k * n + out.index
                news = out.delta_text or out.delta_token_ids or out.delta_tool_calls
                news = news or out.delta_reasoning_text
                if news or out.finished:
                    c = fmt.delta_choice(meta, i, out, params.logprobs, text_of, offsets[i])
                    offsets[i] += len(out.delta_text)
                    yield fmt.sse({**head, "choices": [c], **extra})
                if out.finished:
                    finals[k].append(out)
                item = await anext(gen, None)
            if include_usage:
                yield fmt.sse({**head, "choices": [], "usage": fmt.usage(finals)})
            yield "data: [DONE]\n\n"
    except EngineDeadError as e:
        yield fmt.sse(error_body(503, str(e), code="engine_unavailable"))
    finally:
        ticket.release()
        tracker.done()
