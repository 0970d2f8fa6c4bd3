"""What the engine hands back to callers, one `RequestOutput` per step."""

from __future__ import annotations

from dataclasses import dataclass, field


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
