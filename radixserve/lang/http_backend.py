"""The frontend language over HTTP: `RemoteBackend(url)` runs programs against a radixserve
(or SGLang) server through its native endpoints, the same way as in process.

    import radixserve.lang as sgl
    from radixserve.lang.http_backend import RemoteBackend

    sgl.set_default_backend(RemoteBackend("http://127.0.0.1:8000", api_key="..."))

`gen` is a `/generate` call, streaming reads its server-sent events, `select`
scores each choice with prompt logprobs (`logprob_start_len`) after caching the
prefix once, and the role pieces come from the chat template the server reports
in `/get_model_info` (rendered here with jinja2, as transformers does).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from radixserve.lang.backend import (
    DTYPE_REGEX,
    Backend,
    ChoiceLogprobs,
    GenParams,
    GenResult,
    StreamChunk,
    TokenLogprob,
    common_prefix,
)
from radixserve.lang.chat_template import PLAIN, ChatTemplate, template_from_renderer

_UNSUPPORTED = "unsupported_feature"  # the error code radixserve's server gives a feature it lacks


class RemoteError(RuntimeError):
    """The server answered a request with an error."""


class RemoteBackend(Backend):
    """A radixserve server's native API as a frontend-language backend (works on any event loop)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self._template: ChatTemplate | None = None
        # httpx clients are bound to the loop they first ran on: one per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=self.timeout)
            self._clients[loop] = client
        return client

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        r = await self._client().post(path, json=body)
        _check(r.status_code, r.content)
        return r.json()

    # ---- the interface -------------------------------------------------------------------

    async def chat_template(self) -> ChatTemplate:
        if self._template is None:
            r = await self._client().get("/get_model_info")
            _check(r.status_code, r.content)
            info = r.json()
            self._template = _template(info.get("chat_template"), info.get("special_tokens") or {})
        return self._template

    async def generate(self, prompt: str, params: GenParams) -> list[GenResult]:
        body = self._request(prompt, params)
        answers = await self._post("/generate", body)
        answers = answers if isinstance(answers, list) else [answers]
        return [GenResult(a["text"], _meta(a["meta_info"], params)) for a in answers]

    async def stream(self, prompt: str, params: GenParams) -> AsyncIterator[StreamChunk]:
        if params.n != 1:
            raise ValueError("streaming needs n=1")
        body = {**self._request(prompt, params), "stream": True}
        sent = 0
        async with self._client().stream("POST", "/generate", json=body) as r:
            if r.status_code != 200:
                _check(r.status_code, await r.aread())
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise RemoteError(f"the server failed the request: {event['error'].get('message')}")
                meta = _meta(event["meta_info"], params)  # cumulative, as the server sends it
                text = event["text"]
                yield StreamChunk(text[sent:], meta.get("finish_reason") is not None, meta)
                sent = len(text)

    async def cache_prefix(self, prefix: str) -> dict[str, Any]:
        answer = await self._post("/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0}})
        return dict(answer["meta_info"])

    async def score_choices(
        self, prefix: str, choices: Sequence[str], unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        # The prefix once, into the cache; its token ids come back as its prompt logprobs.
        head = await self._score([prefix], 0)
        pids = [t[1] for t in head[0]["meta_info"]["input_token_logprobs"]]
        # Each choice from two tokens before the prefix's end (where a choice's first token
        # may merge with the prefix's last); the cached prefix before that is not recomputed.
        start = max(len(pids) - 2, 0)
        answers = await self._score([prefix + c for c in choices], start)
        scored = []
        for c, a in zip(choices, answers):
            entries, first = a["meta_info"]["input_token_logprobs"], start
            ids = pids[:start] + [t[1] for t in entries]
            s = common_prefix(pids, ids)
            if s <= start and start > 0:  # the choice re-tokenized the prefix further back
                a = (await self._score([prefix + c], 0))[0]
                entries, first = a["meta_info"]["input_token_logprobs"], 0
                ids = [t[1] for t in entries]
                s = common_prefix(pids, ids)
            if s >= len(ids) or s == 0:
                raise ValueError(f"select: choice {c!r} adds no token after the prompt")
            scored.append((ids[s:], [_triple(t) for t in entries[s - first :]], a["meta_info"]))
        uncond: list[list[TokenLogprob] | None] = [None] * len(choices)
        if unconditional:  # each choice alone; its first token has nothing to be scored on
            alone = await self._score_ids([ids for ids, _, _ in scored])
            uncond = [[(0.0, e[0][1], e[0][2]), *map(_triple, e[1:])] for e in alone]
        return [ChoiceLogprobs(lps, u, _usage(m)) for (_, lps, m), u in zip(scored, uncond)]

    async def flush_cache(self) -> bool:
        r = await self._client().post("/flush_cache")
        if r.status_code == 400:
            return False
        _check(r.status_code, r.content)
        return True

    async def close(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    # ---- requests --------------------------------------------------------------------------

    async def _score(self, texts: list[str], start: int) -> list[dict[str, Any]]:
        body = {
            "text": texts,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "return_text_in_logprobs": True,
        }
        return list(await self._post("/generate", body))

    async def _score_ids(self, prompts: list[list[int]]) -> list[list[Any]]:
        body = {
            "input_ids": prompts,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "return_text_in_logprobs": True,
        }
        return [a["meta_info"]["input_token_logprobs"] for a in await self._post("/generate", body)]

    def _request(self, prompt: str, p: GenParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_new_tokens": p.max_tokens,
            "min_new_tokens": p.min_tokens,
            "n": p.n,
            "stop": list(p.stop),
            "stop_token_ids": list(p.stop_token_ids),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k,
            "min_p": p.min_p,
            "frequency_penalty": p.frequency_penalty,
            "presence_penalty": p.presence_penalty,
            "repetition_penalty": p.repetition_penalty,
            "ignore_eos": p.ignore_eos,
            "sampling_seed": p.seed,
        }
        for name in ("regex", "json_schema", "ebnf"):
            if getattr(p, name) is not None:
                sp[name] = getattr(p, name)
        if p.dtype is not None:
            sp["regex"] = DTYPE_REGEX[p.dtype]
        body: dict[str, Any] = {"text": prompt, "sampling_params": sp}
        if p.return_logprob or p.top_logprobs_num > 0 or p.logprob_start_len is not None:
            body.update(return_logprob=True, top_logprobs_num=p.top_logprobs_num)
            if p.logprob_start_len is not None:
                # The server's first entry (at logprob_start_len) has no logprob; the
                # language's positions start where a logprob exists, from 1.
                body["logprob_start_len"] = max(p.logprob_start_len - 1, 0)
        return body


def _check(status: int, content: bytes) -> None:
    if status == 200:
        return
    try:
        err = json.loads(content)["error"]
        message, code = err.get("message", ""), err.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = content.decode(errors="replace"), None
    if code == _UNSUPPORTED:
        raise NotImplementedError(f"the server cannot do this: {message}")
    if status == 400:
        raise ValueError(f"the server refused the request: {message}")
    raise RemoteError(f"the server answered {status}: {message}")


def _raise_if_aborted(meta: dict[str, Any]) -> None:
    reason = meta.get("finish_reason") or {}
    if reason.get("type") == "abort":
        raise RemoteError(f"the request failed: {reason.get('message') or 'aborted'}")


def _triple(t: Sequence[Any]) -> TokenLogprob:
    return (float(t[0]), int(t[1]), t[2])


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta[k] for k in ("id", "prompt_tokens", "completion_tokens", "cached_tokens") if k in meta}


def _meta(meta: dict[str, Any], p: GenParams) -> dict[str, Any]:
    """The server's meta_info in the shape the in-process backend gives (prompt logprobs from 1)."""
    _raise_if_aborted(meta)
    out = dict(meta)
    if p.logprob_start_len is None:
        out.pop("input_token_logprobs", None)
        out.pop("input_top_logprobs", None)
    elif "input_token_logprobs" in out:
        first = max(p.logprob_start_len, 1) - max(p.logprob_start_len - 1, 0)  # entries before it
        out["input_token_logprobs"] = [_triple(t) for t in out["input_token_logprobs"][first:]]
        out.pop("input_top_logprobs", None)
    if "output_token_logprobs" in out:
        out["output_token_logprobs"] = [_triple(t) for t in out["output_token_logprobs"]]
        tops = out.get("output_top_logprobs") or [None] * len(out["output_token_logprobs"])
        out["output_top_logprobs"] = [[_triple(t) for t in row or ()] for row in tops]
    return out


def _template(source: str | None, special: dict[str, Any]) -> ChatTemplate:
    """Role pieces of the server's jinja chat template, rendered the way transformers renders it."""
    if not source:
        return PLAIN
    from jinja2.exceptions import TemplateError

    from radixserve.model.chat_template import Unsupported, render

    def render_messages(messages: list[dict[str, str]], gen: bool) -> str:
        return render(source, messages, special, add_generation_prompt=gen)

    try:
        return template_from_renderer(render_messages)
    except (ValueError, TemplateError, Unsupported):
        return PLAIN
