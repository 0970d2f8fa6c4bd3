"""The language's words, by SGLang's names: gen, select, roles, flush_cache."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from radixserve.lang.bridge import call_sync, loop_for_sync
from radixserve.lang.choices import ChoicesMethod, token_length_normalized
from radixserve.lang.defaults import as_backend, get_default_backend
from radixserve.lang.ir import Expr, ExprList, Gen, RoleBegin, RoleEnd, Select, as_expr

# gen() argument -> GenParams field (only those given override run()'s defaults).
_GEN_FIELDS = {
    "max_tokens": "max_tokens",
    "min_tokens": "min_tokens",
    "n": "n",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "return_logprob": "return_logprob",
    "logprob_start_len": "logprob_start_len",
    "top_logprobs_num": "top_logprobs_num",
    "regex": "regex",
    "json_schema": "json_schema",
    "ebnf": "ebnf",
}


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: Any = None,
    choices: Sequence[str] | None = None,
    choices_method: ChoicesMethod | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    ebnf: str | None = None,
    seed: int | None = None,
    repetition_penalty: float | None = None,
) -> Expr:
    """Generate text into variable `name`; a value left None comes from run()'s defaults.
    With `choices` it is a `select`; regex/json_schema/ebnf/dtype constrain the text."""
    if stop_regex is not None:
        raise NotImplementedError("gen(stop_regex=...) is not supported; use stop strings or regex")
    if choices:
        return select(name, choices, temperature or 0.0, choices_method or token_length_normalized)
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"gen(regex={regex!r}): not a regular expression: {e}") from e
    given = dict(locals())
    overrides = {field: given[arg] for arg, field in _GEN_FIELDS.items() if given[arg] is not None}
    return Gen(name, overrides, dtype)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Expr:
    """An integer (the variable holds its text, as in SGLang: `int(s[name])`)."""
    return gen(name, max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Expr:
    """A double-quoted string."""
    return gen(name, max_tokens, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesMethod = token_length_normalized,
) -> Expr:
    """Append the most likely of `choices` (scored together in one batch over the prompt),
    each on all of its tokens. `choices_method`: `token_length_normalized` (the highest mean
    token logprob), `greedy_token_selection` or `unconditional_likelihood_normalized`, ours
    or SGLang's (`sglang.greedy_token_selection`, ...), or any object called like them."""
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if not isinstance(choices_method, ChoicesMethod):
        raise TypeError(
            f"select(choices_method={choices_method!r}): use token_length_normalized, "
            "greedy_token_selection or unconditional_likelihood_normalized (ours or SGLang's)"
        )
    return Select(name, tuple(choices), temperature, choices_method)


def _role(role: str, expr: Any = None) -> Expr:
    if expr is None:
        return ExprList((RoleBegin(role), RoleEnd(role)))
    return ExprList((RoleBegin(role), as_expr(expr), RoleEnd(role)))


def system(expr: Any = None) -> Expr:
    return _role("system", expr)


def user(expr: Any = None) -> Expr:
    return _role("user", expr)


def assistant(expr: Any = None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def flush_cache(backend: Any = None) -> bool:
    """Empty the backend's prefix cache (False when none is set or requests are running)."""
    be = as_backend(backend) if backend is not None else get_default_backend()
    if be is None:
        return False
    loop = loop_for_sync(be)
    return bool(call_sync(loop, be.flush_cache))
