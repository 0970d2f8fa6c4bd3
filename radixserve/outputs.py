"""What the engine hands back to callers: `RequestOutput`s, at most one per completion per step.

A streaming caller that reads slower than the engine produces gets fewer,
larger outputs: an output not yet read when the next one of its completion
arrives is merged with it (`merge`), so no token or text is lost or repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the radix cache
    # Completion tokens that structured output's jump-forward appended without sampling.
    jump_forward_tokens: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    index: int  # which of the n completions
    delta_text: str
    delta_token_ids: tuple[int, ...]
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort" or None while running
    usage: Usage
    stop_reason: str | int | None = None  # the stop string or token id that matched
    logprobs: tuple[TokenLogprob, ...] = ()  # for token_ids (all so far), when asked
    delta_logprobs: tuple[TokenLogprob, ...] = ()  # for delta_token_ids
    # Prompt token logprobs (from prompt_logprobs_start on), once computed.
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    error: str | None = field(default=None)  # why, when finish_reason == "abort"


# The hot path builds one output per streamed completion per step. A frozen
# dataclass's __init__ pays one object.__setattr__ per field (about 5 µs for
# RequestOutput); filling the instance dict directly makes the same object.
_new = object.__new__


def new_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, jump_forward_tokens: int
) -> Usage:
    u = _new(Usage)
    u.__dict__.update(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        jump_forward_tokens=jump_forward_tokens,
    )
    return u


def new_output(
    request_id: str,
    index: int,
    delta_text: str,
    delta_token_ids: tuple[int, ...],
    text: str,
    token_ids: tuple[int, ...],
    finished: bool,
    finish_reason: str | None,
    usage: Usage,
    stop_reason: str | int | None,
    logprobs: tuple[TokenLogprob, ...],
    delta_logprobs: tuple[TokenLogprob, ...],
    prompt_logprobs: tuple[TokenLogprob, ...],
    error: str | None,
) -> RequestOutput:
    """`RequestOutput(...)` with every field given, without the frozen dataclass's __init__."""
    out = _new(RequestOutput)
    out.__dict__.update(
        request_id=request_id,
        index=index,
        delta_text=delta_text,
        delta_token_ids=delta_token_ids,
        text=text,
        token_ids=token_ids,
        finished=finished,
        finish_reason=finish_reason,
        usage=usage,
        stop_reason=stop_reason,
        logprobs=logprobs,
        delta_logprobs=delta_logprobs,
        prompt_logprobs=prompt_logprobs,
        error=error,
    )
    return out


def merge(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """One output for two successive ones of a completion: the deltas joined, the rest from `new`."""
    fields: dict[str, Any] = dict(new.__dict__)
    fields["delta_text"] = old.delta_text + new.delta_text
    fields["delta_token_ids"] = old.delta_token_ids + new.delta_token_ids
    fields["delta_logprobs"] = old.delta_logprobs + new.delta_logprobs
    out = _new(RequestOutput)
    out.__dict__.update(fields)
    return out
