"""What the engine hands back to callers: `RequestOutput`s, at most one per completion per step.

A streaming caller that reads slower than the engine produces gets fewer,
larger outputs: the worker builds no output for a completion whose previous
one is still unread (sched/process.py), and one that still arrives then (a
final output) is merged with it (`merge`), so no token or text is lost or
repeated. `token_ids` is made when first read (see `RequestOutput.__getattr__`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixserve.tools.types import ToolCall, ToolCallDelta


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
    # Chat requests whose outputs are parsed (tools given, or a reasoning model): `text` and
    # `delta_text` are then the answer's content, without tool-call markup or the reasoning
    # block; `token_ids` stay what the model sampled. finish_reason is "tool_calls" when a
    # completion that stopped made calls. See radixserve/chat_plan.py.
    tool_calls: tuple[ToolCall, ...] = ()  # complete calls so far
    delta_tool_calls: tuple[ToolCallDelta, ...] = ()  # OpenAI-shaped stream pieces
    reasoning_text: str | None = None  # the reasoning block's text (None: not a reasoning parse)
    delta_reasoning_text: str = ""

    if not TYPE_CHECKING:  # (hidden from type checkers: every field stays typed)

        def __getattr__(self, name: str) -> Any:
            # `token_ids` of an output the worker built is made when first read: the
            # worker hands over its request's output ids (a list it only appends to) and
            # how many this output covers, so an output costs no copy of the whole sequence.
            lazy = self.__dict__.get("_ids") if name == "token_ids" else None
            if lazy is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            ids, n = lazy
            value = self.__dict__["token_ids"] = tuple(ids[:n])
            return value


# The hot path builds one output per streamed completion per step. A frozen
# dataclass's __init__ pays one object.__setattr__ per field (about 5 µs for
# RequestOutput); giving the instance its dict whole makes the same object in
# about a third of that.
_new = object.__new__
_set_dict = object.__setattr__


def new_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, jump_forward_tokens: int
) -> Usage:
    u = _new(Usage)
    _set_dict(
        u,
        "__dict__",
        {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "jump_forward_tokens": jump_forward_tokens,
        },
    )
    return u


def new_output(
    request_id: str,
    index: int,
    delta_text: str,
    delta_token_ids: tuple[int, ...],
    text: str,
    token_ids: tuple[int, ...] | list[int],
    finished: bool,
    finish_reason: str | None,
    usage: Usage,
    stop_reason: str | int | None,
    logprobs: tuple[TokenLogprob, ...],
    delta_logprobs: tuple[TokenLogprob, ...],
    prompt_logprobs: tuple[TokenLogprob, ...],
    error: str | None,
) -> RequestOutput:
    """`RequestOutput(...)` with every field given, without the frozen dataclass's __init__.

    `token_ids` may be a list that only grows (a request's output ids): the output
    then covers its first len(token_ids) items, copied into a tuple when first read."""
    fields: dict[str, Any] = {
        "request_id": request_id,
        "index": index,
        "delta_text": delta_text,
        "delta_token_ids": delta_token_ids,
        "text": text,
        "finished": finished,
        "finish_reason": finish_reason,
        "usage": usage,
        "stop_reason": stop_reason,
        "logprobs": logprobs,
        "delta_logprobs": delta_logprobs,
        "prompt_logprobs": prompt_logprobs,
        "error": error,
        "tool_calls": (),
        "delta_tool_calls": (),
        "reasoning_text": None,
        "delta_reasoning_text": "",
    }
    if isinstance(token_ids, tuple):
        fields["token_ids"] = token_ids
    else:
        fields["_ids"] = (token_ids, len(token_ids))
    out = _new(RequestOutput)
    _set_dict(out, "__dict__", fields)
    return out


def rewritten(out: RequestOutput, **changes: Any) -> RequestOutput:
    """`out` with some fields changed (token_ids left lazy), as `dataclasses.replace` would."""
    fields: dict[str, Any] = dict(out.__dict__)
    fields.update(changes)
    new = _new(RequestOutput)
    _set_dict(new, "__dict__", fields)
    return new


def merge(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """One output for two successive ones of a completion: the deltas joined, the rest from `new`."""
    fields: dict[str, Any] = dict(new.__dict__)
    fields["delta_text"] = old.delta_text + new.delta_text
    fields["delta_token_ids"] = old.delta_token_ids + new.delta_token_ids
    fields["delta_logprobs"] = old.delta_logprobs + new.delta_logprobs
    fields["delta_tool_calls"] = old.delta_tool_calls + new.delta_tool_calls
    fields["delta_reasoning_text"] = old.delta_reasoning_text + new.delta_reasoning_text
    out = _new(RequestOutput)
    _set_dict(out, "__dict__", fields)
    return out
