"""Checks of what callers hand in, run in the caller's thread before anything reaches the worker.

`SamplingParams` uses the field checks (each raises `ValueError` naming the
field); `AsyncEngine` uses the prompt checks. Every limit here exists so that
a value that passes can never fail the worker or sample garbage:

- floats are converted with `float()` (an int too large for a float is
  rejected, not an `OverflowError` later) and must be finite; their ranges
  keep float32 arithmetic on the device finite (a penalty of 1e300 is inf in
  float32, and inf * 0 is NaN).
- `logit_bias` is a mapping of token id to a finite bias in [-100, 100]
  (OpenAI's range: +-100 bans or forces a token in practice; +-inf would make
  NaN probabilities, so it is rejected).
- sizes (number of stop strings, stop ids, biased tokens, `n`) are bounded so
  one request cannot make the per-step host work unbounded.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

MAX_N = 128  # completions per request
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS_TOKENS = 4096
LOGIT_BIAS_LIMIT = 100.0
MAX_TEMPERATURE = 100.0
# Temperatures below this sample greedily (as vLLM does): logits / 1e-45 overflow to inf.
GREEDY_TEMPERATURE = 1e-5
REPETITION_PENALTY_RANGE = (0.01, 100.0)
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


def _fail(owner: str, name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{owner}.{name}={_short(value)}: {why}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_int(name: str, v: Any, low: int, high: int | None = None, owner: str = "SamplingParams") -> int:
    if not is_int(v) or v < low or (high is not None and v > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _fail(owner, name, v, f"must be an integer {rng}")
    return int(v)


def check_float(
    name: str,
    v: Any,
    low: float,
    high: float,
    low_open: bool = False,
    owner: str = "SamplingParams",
) -> float:
    """`v` as a finite float in the range; ints are converted (too large for a float: rejected)."""
    lo, hi = "(" if low_open else "[", "]"
    why = f"must be a finite number in {lo}{low}, {high}{hi}"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(owner, name, v, why)
    try:
        f = float(v)
    except OverflowError:
        raise _fail(owner, name, v, why) from None
    if not math.isfinite(f) or (f <= low if low_open else f < low) or f > high:
        raise _fail(owner, name, v, why)
    return f


def check_bool(name: str, v: Any, owner: str = "SamplingParams") -> bool:
    if not isinstance(v, bool):
        raise _fail(owner, name, v, "must be True or False")
    return v


def check_text(name: str, s: str, owner: str = "SamplingParams") -> None:
    """A str that can be encoded (no lone surrogates)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _fail(owner, name, s, f"is not valid unicode ({e.reason} at {e.start})") from None


def stop_strings(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = (v,)
    elif not isinstance(v, Sequence) or isinstance(v, (bytes, bytearray)):
        raise _fail("SamplingParams", "stop", v, "must be a string or a list of strings")
    out = tuple(v)
    if len(out) > MAX_STOP_STRINGS:
        raise _fail("SamplingParams", "stop", v, f"at most {MAX_STOP_STRINGS} stop strings")
    for s in out:
        if not isinstance(s, str) or not s or len(s) > MAX_STOP_STRING_CHARS:
            raise _fail(
                "SamplingParams",
                "stop",
                v,
                f"must be non-empty strings of at most {MAX_STOP_STRING_CHARS} chars",
            )
        check_text("stop", s)
    return out


def token_ids(name: str, v: Any, limit: int) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, (str, bytes, bytearray, Mapping)) or not isinstance(v, Sequence | set | frozenset):
        raise _fail("SamplingParams", name, v, "must be a list of token ids")
    out = tuple(v)
    if len(out) > limit:
        raise _fail("SamplingParams", name, v, f"at most {limit} token ids")
    if not all(is_int(t) and t >= 0 for t in out):
        raise _fail("SamplingParams", name, v, "must be non-negative integers")
    return tuple(int(t) for t in out)


def logit_bias(v: Any) -> dict[int, float]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise _fail("SamplingParams", "logit_bias", v, "must be a mapping of token id to bias")
    if len(v) > MAX_LOGIT_BIAS_TOKENS:
        raise _fail("SamplingParams", "logit_bias", v, f"at most {MAX_LOGIT_BIAS_TOKENS} tokens")
    out: dict[int, float] = {}
    for tok, bias in v.items():
        # JSON bodies carry keys as strings ("42"): accept decimal strings like OpenAI does.
        key = int(tok) if isinstance(tok, str) and tok.isdigit() and tok.isascii() else tok
        if not is_int(key) or key < 0:
            raise _fail("SamplingParams", "logit_bias", v, f"key {_short(tok)} is not a token id")
        lim = LOGIT_BIAS_LIMIT
        out[int(key)] = check_float(f"logit_bias[{key}]", bias, -lim, lim)
    return out


def _index(t: Any) -> int:
    if isinstance(t, bool):
        raise TypeError
    return operator.index(t)


def prompt_token_ids(seq: Sequence[Any]) -> list[int]:
    """A list of token ids (ints, numpy or 0-d torch integers); the range is checked by the engine."""
    try:
        return [_index(t) for t in seq]
    except TypeError:
        raise ValueError(
            "a prompt is a string, a list of chat messages (dicts) or a list of integer token ids"
        ) from None
