"""Request bodies of the OpenAI-compatible routes (pydantic) and their `SamplingParams`.

Fields OpenAI defines and radixserve cannot honour (audio, images,
`echo`, `suffix`, `best_of`) are a clear 400, never silently ignored; fields
it does not know are ignored, as OpenAI's own server does for forward compatibility.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixserve.sampling_params import SamplingParams
from radixserve.server.errors import APIError, bad_request


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | dict[str, Any]] | None = None
    name: str | None = None
    # An assistant turn's calls and a tool turn's answer to one (radixserve/chat_input.py checks them).
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def message(self, i: int) -> dict[str, Any]:
        """The message as the chat template gets it (text content, tool fields when given)."""
        m: dict[str, Any] = {"role": self.role, "content": self.text(i)}
        if self.tool_calls is not None:
            m["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        return m

    def text(self, i: int) -> str:
        if self.content is None:
            if self.role == "assistant":
                return ""
            raise APIError(400, f"messages[{i}].content: missing", param=f"messages[{i}].content")
        if isinstance(self.content, str):
            return self.content
        parts = []
        for j, part in enumerate(self.content):
            if not isinstance(part, TextPart):
                kind = part.get("type", "?") if isinstance(part, dict) else "?"
                raise APIError(
                    400,
                    f"messages[{i}].content[{j}]: content of type {kind!r} is not supported (text only)",
                    param=f"messages[{i}].content",
                )
            parts.append(part.text)
        return "".join(parts)


class StreamOptions(_Body):
    include_usage: bool = False


class JSONSchemaFormat(_Body):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class _Sampling(_Body):
    model: str
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions vLLM and SGLang accept too (the openai client sends them via `extra_body`).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    regex: str | None = None  # structured output as SGLang's OpenAI routes take it
    ebnf: str | None = None

    def base_params(self, max_tokens: int, logprobs: bool, top: int, limit_n: int) -> dict[str, Any]:
        if self.n > limit_n:
            raise APIError(400, f"n={self.n}: this server allows at most {limit_n}", param="n")
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit():
                raise APIError(400, f"logit_bias: key {key!r} is not a token id", param="logit_bias")
            if not -100 <= value <= 100:
                raise APIError(400, f"logit_bias[{key}]={value}: must be in [-100, 100]", param="logit_bias")
            bias[int(key)] = value
        kw: dict[str, Any] = dict(
            max_tokens=max_tokens,
            n=self.n,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            seed=self.seed,
            logprobs=logprobs,
            top_logprobs=top,
            logit_bias=bias,
        )
        extensions = ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "regex", "ebnf")
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", *extensions):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        if self.temperature is not None and self.temperature > 2:
            raise APIError(400, f"temperature={self.temperature}: must be in [0, 2]", param="temperature")
        return kw


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    # Checked by radixserve/chat_plan.py (a 400 names the field): OpenAI's function tools,
    # "none" / "auto" / "required" / {"type": "function", "function": {"name": ...}}.
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # Extension vLLM and SGLang accept: extra chat template variables (`enable_thinking`).
    chat_template_kwargs: dict[str, Any] | None = None

    def prompt(self) -> list[dict[str, Any]]:
        return [m.message(i) for i, m in enumerate(self.messages)]

    def sampling_params(self, room: int, limit_n: int) -> SamplingParams:
        top = self.top_logprobs or 0
        if top and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        asked = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        kw = self.base_params(room if asked is None else asked, self.logprobs, top, limit_n)
        schema = _schema(self.response_format)
        return _make(kw, schema)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        if self.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported by this server", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, "best_of other than n is not supported", param="best_of")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt: must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def sampling_params(self, limit_n: int) -> SamplingParams:
        top = self.logprobs or 0
        kw = self.base_params(
            16 if self.max_tokens is None else self.max_tokens, self.logprobs is not None, top, limit_n
        )
        return _make(kw, None)


def _schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(400, "response_format.json_schema.schema: missing", param="response_format")
    return fmt.json_schema.schema_


def _make(kw: dict[str, Any], schema: dict[str, Any] | None) -> SamplingParams:
    if schema is not None:
        kw["json_schema"] = schema
    try:
        return SamplingParams(**kw)
    except TypeError as e:
        if schema is not None and "json_schema" in str(e):
            raise APIError(
                400, "response_format is not supported by this build", param="response_format"
            ) from e
        raise bad_request(e) from e
    except ValueError as e:
        raise bad_request(e) from e
