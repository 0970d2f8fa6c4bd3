"""OpenAI's response objects built from `RequestOutput`s: choices, chunks, logprobs and usage."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve.outputs import RequestOutput, TokenLogprob


@dataclass(frozen=True)
class Meta:
    """What every object of one response repeats."""

    kind: str  # "chat" or "text"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @staticmethod
    def new(kind: str, model: str) -> Meta:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return Meta(kind, model, f"{prefix}-{uuid.uuid4().hex}")

    def envelope(self, chunk: bool) -> dict[str, Any]:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {
            "id": self.id,
            "object": obj + (".chunk" if chunk and self.kind == "chat" else ""),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }


class TokenText:
    """Text of single tokens for logprobs (cached: the same ids come back often)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.tok.decode([token_id]) if self.tok is not None else str(token_id)
            self.cache[token_id] = text
        return text


def chat_logprobs(lps: Sequence[TokenLogprob], text_of: TokenText) -> dict[str, Any]:
    def entry(tid: int, lp: float) -> dict[str, Any]:
        t = text_of(tid)
        return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}

    content = [
        {**entry(x.token_id, x.logprob), "top_logprobs": [entry(i, lp) for i, lp in x.top]} for x in lps
    ]
    return {"content": content, "refusal": None}


def text_logprobs(lps: Sequence[TokenLogprob], text_of: TokenText, offset: int) -> dict[str, Any]:
    tokens = [text_of(x.token_id) for x in lps]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [x.logprob for x in lps],
        "top_logprobs": [{text_of(i): lp for i, lp in x.top} for x in lps],
        "text_offset": offsets,
    }


def usage(finals: Sequence[Sequence[RequestOutput]]) -> dict[str, Any]:
    """One entry per prompt, each with its n outputs: a prompt counts once, completions all."""
    prompt = sum(outs[0].usage.prompt_tokens for outs in finals if outs)
    cached = sum(outs[0].usage.cached_tokens for outs in finals if outs)
    completion = sum(o.usage.completion_tokens for outs in finals for o in outs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def finish_reason(out: RequestOutput) -> str | None:
    return out.finish_reason if out.finish_reason in ("stop", "length", "tool_calls") else None


def message(out: RequestOutput) -> dict[str, Any]:
    """A chat choice's message: content (null beside calls when there is none), the calls and
    the reasoning (`reasoning_content`, as vLLM and SGLang name it) when parsed."""
    m: dict[str, Any] = {"role": "assistant", "content": out.text, "refusal": None}
    if out.tool_calls:
        m["content"] = out.text or None
        m["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in out.tool_calls
        ]
    if out.reasoning_text is not None:
        m["reasoning_content"] = out.reasoning_text or None
    return m


def delta(out: RequestOutput) -> dict[str, Any]:
    """A chat chunk's delta: OpenAI's tool-call pieces (`index`, then `id`, `type` and the name
    on a call's first piece, `function.arguments` pieces after)."""
    d: dict[str, Any] = {"content": out.delta_text} if out.delta_text else {}
    if out.delta_reasoning_text:
        d["reasoning_content"] = out.delta_reasoning_text
    if out.delta_tool_calls:
        calls = []
        for c in out.delta_tool_calls:
            piece: dict[str, Any] = {"index": c.index}
            fn: dict[str, Any] = {}
            if c.id is not None:
                piece["id"], piece["type"] = c.id, "function"
            if c.name is not None:
                fn["name"] = c.name
            if c.arguments or c.name is not None:
                fn["arguments"] = c.arguments
            piece["function"] = fn
            calls.append(piece)
        d["tool_calls"] = calls
    return d


def choice(meta: Meta, index: int, out: RequestOutput, logprobs: bool, text_of: TokenText) -> dict[str, Any]:
    lp = out.logprobs if logprobs else None
    if meta.kind == "chat":
        return {
            "index": index,
            "message": message(out),
            "logprobs": chat_logprobs(lp, text_of) if lp is not None else None,
            "finish_reason": finish_reason(out),
        }
    return {
        "index": index,
        "text": out.text,
        "logprobs": text_logprobs(lp, text_of, 0) if lp is not None else None,
        "finish_reason": finish_reason(out),
    }


def delta_choice(
    meta: Meta, index: int, out: RequestOutput, logprobs: bool, text_of: TokenText, offset: int
) -> dict[str, Any]:
    lp = out.delta_logprobs if logprobs else None
    reason = finish_reason(out) if out.finished else None
    if meta.kind == "chat":
        return {
            "index": index,
            "delta": delta(out),
            "logprobs": chat_logprobs(lp, text_of) if lp is not None else None,
            "finish_reason": reason,
        }
    return {
        "index": index,
        "text": out.delta_text,
        "logprobs": text_logprobs(lp, text_of, offset) if lp is not None else None,
        "finish_reason": reason,
    }


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
