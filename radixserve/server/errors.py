"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every route.

Routes raise `APIError`; the handlers installed by `install_error_handlers` also
turn FastAPI's validation errors (malformed JSON, wrong field types) into a 400
in the same shape, so clients see one error format whatever went wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

# The `type` OpenAI sends with each status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error a route answers with: status code, message and OpenAI's optional param/code."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class BodyError(StarletteHTTPException):
    """A request body the server refuses: a 400 with an error code.

    An HTTPException so that FastAPI's body parsing passes it on unchanged."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(400, message)
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


async def send_error(send: Send, status: int, message: str, code: str | None = None) -> None:
    """Answer with an error from ASGI middleware, outside the app's exception handlers."""
    data = json.dumps(error_body(status, message, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def bad_request(e: ValueError | TypeError) -> APIError:
    """A 400 from a validation error; `param` is the field a SamplingParams error names."""
    message = str(e)
    m = re.match(r"SamplingParams\.(\w+)", message)
    return APIError(400, message, param=m.group(1) if m else None)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg', '')}", None
    where = ".".join(loc)
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return (
        f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg"))
    ) + more, where or None


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc.status, exc.message, exc.param, exc.code)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = exc.code if isinstance(exc, BodyError) else None
        return error_response(exc.status_code, str(exc.detail), code=code, headers=exc.headers)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Still OpenAI's shape (Starlette logs the traceback); the message names the type only.
        return error_response(500, f"internal server error ({type(exc).__name__})")

    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
