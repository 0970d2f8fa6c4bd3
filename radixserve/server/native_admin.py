"""SGLang's native endpoints besides `/generate`: model and server info, cache, health, aborts.

`/get_model_info` (`/model_info`), `/server_info` (`/get_server_info`),
`/flush_cache`, `/health`, `/health_generate` and `/abort_request`, in SGLang's
shapes; SGLang endpoints radixserve has no counterpart for that SGLang's
frontend may call (profiling, concatenating requests) answer a clear 400.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from radixserve.sampling_params import SamplingParams
from radixserve.server.body import JSONRoute
from radixserve.server.errors import APIError, error_response
from radixserve.server.native_protocol import UNSUPPORTED_CODE
from radixserve.server.serving import engine_of

if TYPE_CHECKING:
    from radixserve.engine import AsyncEngine

router = APIRouter(tags=["sglang-native"], route_class=JSONRoute)
_HEALTH_TIMEOUT_S = 20.0


def _failure(e: Exception) -> JSONResponse:
    if isinstance(e, APIError):
        return error_response(e.status, e.message, e.param, e.code)
    return error_response(503, f"the engine cannot serve requests: {e}")


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request) -> dict[str, Any]:
    """What the server runs; `model_path` picks the chat template of SGLang's frontend."""
    engine: AsyncEngine = request.app.state.engine
    tok = engine.tokenizer
    hf = engine.loaded.hf_config if engine.loaded is not None else None
    return {
        "model_path": engine.config.model,
        "served_model_name": request.app.state.settings.model_name,
        "tokenizer_path": engine.config.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(hf, "model_type", None),
        "architectures": getattr(hf, "architectures", None),
        "context_length": engine.context_length,
        # For clients that render prompts themselves (radixserve's remote frontend backend).
        "chat_template": getattr(tok, "chat_template", None),
        "special_tokens": {k: getattr(tok, k, None) for k in ("bos_token", "eos_token")},
    }


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> Response:
    """The engine's configuration and its live scheduler state (`internal_states`)."""
    from radixserve.version import __version__

    try:
        engine = engine_of(request)
        stats = await engine.stats()
    except Exception as e:
        return _failure(e)
    info = dataclasses.asdict(engine.config)
    info.update(context_length=engine.context_length, internal_states=[stats], version=__version__)
    info["frontend"] = "radixserve"
    return JSONResponse(info)


@router.post("/flush_cache")
async def flush_cache(request: Request) -> Response:
    """Empty the radix cache; 400 while requests are running (nothing is done then).

    POST only: a GET that changes state is one a web page can trigger with an image tag."""
    try:
        done = await engine_of(request).flush_cache()
    except Exception as e:
        return _failure(e)
    if done:
        return PlainTextResponse("Cache flushed.\n")
    return PlainTextResponse("Cache not flushed: requests are running.\n", status_code=400)


@router.get("/health")
async def health(request: Request) -> Response:
    return Response(status_code=200 if request.app.state.engine.healthy else 503)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Healthy when the engine generates one token within the timeout."""
    try:
        engine = engine_of(request)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        await asyncio.wait_for(engine.complete([0], params), _HEALTH_TIMEOUT_S)
    except Exception:
        return Response(status_code=503)
    return Response(status_code=200)


class AbortReq(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: bool = False


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    """Abort the running request `rid` (its answer or stream ends with finish_reason abort)."""
    body = await request.json()  # a BodyError (400) when not JSON or nested too deep
    try:
        req = AbortReq.model_validate(body)
    except ValidationError as e:
        return error_response(400, f'abort_request takes {{"rid": ...}}: {e}')
    if req.abort_all or not req.rid:
        return error_response(
            400, "give the rid of one request (abort_all is not supported)", code=UNSUPPORTED_CODE
        )
    try:
        await engine_of(request).abort(req.rid)
    except Exception as e:
        return _failure(e)
    return Response(status_code=200)


@router.api_route("/start_profile", methods=["GET", "POST"])
@router.api_route("/stop_profile", methods=["GET", "POST"])
@router.api_route("/concate_and_append_request", methods=["GET", "POST"])
async def unsupported(request: Request) -> Response:
    """SGLang endpoints with no radixserve counterpart."""
    return error_response(400, f"{request.url.path} is not supported by radixserve", code=UNSUPPORTED_CODE)
