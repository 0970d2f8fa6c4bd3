"""A request prepared in front of replicas: chat rendered with its tools, tokenized, checked.

One engine does this itself (`LocalEngine`); a core of replicas (`ReplicaSet`,
and radixserve.ray's ingress) does it once, routes on the token ids, and hands
the replica ids it runs as they are. Both cores check request ids and parse
chat outputs with the helpers here.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from radixserve.chat_output import ChatRewriter
from radixserve.chat_plan import ChatOptions, ChatParsers, prepare_chat
from radixserve.outputs import RequestOutput
from radixserve.prompts import Prompt, tokenize_prompt
from radixserve.sampling_params import SamplingParams
from radixserve.submission import check_prompt_ids


def prepare_request(
    tokenizer: Any,  # transformers' tokenizer (untyped) or TextTokenizer, as the replicas load it
    parsers: ChatParsers | None,
    context_length: int,
    vocab_size: int,
    prompt: Prompt,
    params: SamplingParams,
    options: ChatOptions,
) -> tuple[list[int], SamplingParams, ChatRewriter | None]:
    """The prompt's token ids, the params to run them with (a tool call's constraint added),
    and how chat outputs are parsed (None: not a parsed chat). Raises what one engine raises."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    prompt, params, rewrite = prepare_chat(tokenizer, parsers, prompt, params, options)
    ids = tokenize_prompt(tokenizer, prompt)
    # Checked here as well as in the replica: a prompt it would refuse must not be routed.
    check_prompt_ids(ids, context_length, vocab_size)
    return ids, params, rewrite


def check_ids(request_id: str | None, extra_key: str | None, running: Container[str]) -> None:
    """Raise what one engine raises for a request's ids, before the request is routed
    (`running`: the ids of the requests live in front of the replicas)."""
    if request_id is not None and not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    if extra_key is not None and not isinstance(extra_key, str):
        raise TypeError(f"extra_key must be a str or None, got {type(extra_key).__name__}")
    if request_id is not None and request_id in running:
        raise ValueError(f"request_id {request_id!r} is already running")


def rewrite_result(
    rewrite: ChatRewriter | None, result: RequestOutput | list[RequestOutput]
) -> RequestOutput | list[RequestOutput]:
    """A replica's `complete()` result with its chat outputs parsed (`prepare_request`'s rewrite)."""
    if rewrite is None:
        return result
    return [rewrite(o) for o in result] if isinstance(result, list) else rewrite(result)
