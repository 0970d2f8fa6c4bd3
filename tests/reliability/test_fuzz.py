"""Hypothesis fuzzing through the engine: prompts (types, sizes, unicode), chat messages and
sampling parameters. Each example is a result or a ValueError / TypeError in the caller, never a
worker failure; the engine is healthy after every one (and its KV intact at the end)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve import Engine, RequestOutput, SamplingParams

pytestmark = pytest.mark.timeout(600)
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VOCAB = 49152

any_text = st.text(st.characters(blacklist_categories=()), max_size=40)  # surrogates included
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), any_text, st.binary(max_size=8))
token_lists = st.lists(st.integers(min_value=-3, max_value=VOCAB + 3), max_size=24)
messages = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "tool_calls", ""]),
        st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "wizard"]), any_text, scalars),
        max_size=3,
    ),
    min_size=1,
    max_size=3,
)
prompts = st.one_of(
    any_text,
    token_lists,
    messages,
    scalars,
    st.lists(scalars, max_size=4),
    st.tuples(st.integers(min_value=0, max_value=VOCAB - 1)),
)


def _check(engine: Engine, prompt: Any, params: SamplingParams) -> None:
    try:
        out = engine.complete(prompt, params)
    except (ValueError, TypeError) as e:
        assert str(e), "an error without a message"
    else:
        outs = out if isinstance(out, list) else [out]
        assert all(isinstance(o, RequestOutput) and o.finished for o in outs)
        assert all(o.finish_reason in ("stop", "length") for o in outs), outs
    assert engine.healthy


@FUZZ
@given(prompts)
def test_fuzzed_prompts(engine: Engine, prompt: Any) -> None:
    _check(engine, prompt, SamplingParams(max_tokens=2))


@FUZZ
@given(messages)
def test_fuzzed_chat_messages(engine: Engine, chat: Any) -> None:
    _check(engine, chat, SamplingParams(max_tokens=2))


def _floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.one_of(st.floats(lo, hi), st.sampled_from([lo, hi, 0.0, 1e-45, 1e-6]), st.floats())


sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(0, 3),
        "min_tokens": st.integers(0, 3),
        "temperature": _floats(0.0, 100.0),
        "top_p": _floats(0.0, 1.0),
        "top_k": st.one_of(st.integers(-1, 60), st.integers(min_value=2**62, max_value=2**70)),
        "min_p": _floats(0.0, 1.0),
        "frequency_penalty": _floats(-2.0, 2.0),
        "presence_penalty": _floats(-2.0, 2.0),
        "repetition_penalty": _floats(0.01, 100.0),
        "stop": st.lists(any_text, max_size=3),
        "stop_token_ids": st.lists(st.integers(0, VOCAB + 2), max_size=3),
        "seed": st.one_of(st.none(), st.integers(-(2**70), 2**70)),
        "n": st.integers(1, 3),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 3),
        "logit_bias": st.dictionaries(st.integers(0, VOCAB + 2), _floats(-100.0, 100.0), max_size=3),
        "ignore_eos": st.booleans(),
        "skip_special_tokens": st.booleans(),
    },
)


@FUZZ
@given(sampling, st.sampled_from(["Hello", [1, 2, 3], [{"role": "user", "content": "Hi"}]]))
def test_fuzzed_sampling_params(engine: Engine, kw: dict[str, Any], prompt: Any) -> None:
    kw.setdefault("max_tokens", 3)
    try:
        params = SamplingParams(**kw)
    except ValueError as e:
        assert str(e).startswith("SamplingParams."), e
        return
    _check(engine, prompt, params)
