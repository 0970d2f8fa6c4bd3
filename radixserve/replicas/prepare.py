"""A request prepared in front of replicas: chat rendered with its tools, tokenized, checked.

One engine does this in `AsyncEngine.generate` / `complete`; an engine of replicas
(`ReplicaSet`, and radixserve.ray's ingress) does it once, routes on the
token ids, and hands the replica ids it runs as they are.
"""

from __future__ import annotations

from typing import Any

from radixserve.chat_output import ChatRewriter
from radixserve.chat_plan import ChatOptions, ChatParsers, prepare_chat
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
