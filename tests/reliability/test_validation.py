"""SamplingParams validation (issue 8, items 1, 7, 8): every bad value is a ValueError naming the
field, raised on construction; every accepted value is stored in a form the worker can use."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve import SamplingParams
from radixserve import validation as V

BAD = [
    # item 1: ints too large for a float, top_k beyond int64 is fine (see below), huge floats
    ({"temperature": 10**400}, "temperature"),
    ({"repetition_penalty": 10**400}, "repetition_penalty"),
    ({"logit_bias": {5: 10**400}}, "logit_bias"),
    ({"top_p": 10**400}, "top_p"),
    ({"frequency_penalty": -(10**400)}, "frequency_penalty"),
    ({"repetition_penalty": 1e300}, "repetition_penalty"),  # inf in float32
    ({"temperature": 1e300}, "temperature"),
    # item 8: inf / nan
    ({"logit_bias": {5: math.inf}}, "logit_bias"),
    ({"logit_bias": {5: -math.inf}}, "logit_bias"),
    ({"logit_bias": {5: math.nan}}, "logit_bias"),
    ({"temperature": math.inf}, "temperature"),
    ({"min_p": math.nan}, "min_p"),
    # item 7: types
    ({"stop": 5}, "stop"),
    ({"stop": b"end"}, "stop"),
    ({"stop": [5]}, "stop"),
    ({"stop": ["\ud800"]}, "stop"),  # a lone surrogate
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": "12"}, "stop_token_ids"),
    ({"stop_token_ids": [1.5]}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {5: "1"}}, "logit_bias"),
    ({"logit_bias": {5: 101}}, "logit_bias"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_k": 1.0}, "top_k"),
    ({"max_tokens": None}, "max_tokens"),
    ({"seed": 1.5}, "seed"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"logprobs": "yes"}, "logprobs"),
    # sizes
    ({"n": V.MAX_N + 1}, "n"),
    ({"stop": ["x"] * (V.MAX_STOP_STRINGS + 1)}, "stop"),
    ({"stop": ["x" * (V.MAX_STOP_STRING_CHARS + 1)]}, "stop"),
    ({"stop_token_ids": list(range(V.MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids"),
    ({"repetition_penalty": 0.001}, "repetition_penalty"),
]


@pytest.mark.parametrize(("kw", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_values_raise_value_error_naming_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kw)


def test_accepted_values_are_normalized() -> None:
    p = SamplingParams(temperature=1, top_p=1, repetition_penalty=2, logit_bias={"7": 3}, stop="x")
    assert type(p.temperature) is float and type(p.top_p) is float and type(p.repetition_penalty) is float
    assert p.logit_bias == {7: 3.0} and type(p.logit_bias[7]) is float  # JSON-style string keys
    assert p.stop == ("x",)
    assert SamplingParams(stop_token_ids={3, 1}).stop_token_ids in ((1, 3), (3, 1))
    assert SamplingParams(stop=None, stop_token_ids=None, logit_bias=None).stop == ()
    # Any top_k >= 1 is accepted (the sampler clamps it to the vocabulary), e.g. beyond int64.
    assert SamplingParams(top_k=2**64).top_k == 2**64


def test_tiny_temperatures_are_greedy() -> None:
    assert SamplingParams(temperature=1e-45).greedy
    assert SamplingParams(temperature=V.GREEDY_TEMPERATURE / 2).greedy
    assert not SamplingParams(temperature=V.GREEDY_TEMPERATURE).greedy


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.binary(max_size=3),
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.floats()), max_size=4),
    st.dictionaries(st.one_of(st.integers(), st.text(max_size=2)), st.one_of(st.floats(), st.integers())),
)
FIELDS = [
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "seed",
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "ignore_eos",
]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), _values, max_size=4))
def test_fuzzed_construction_is_valid_or_a_value_error(kw: dict[str, Any]) -> None:
    try:
        p = SamplingParams(**kw)
    except ValueError as e:
        assert str(e).startswith("SamplingParams."), e
        return
    # What was accepted is finite, typed and within the documented bounds.
    floats = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
    for name in floats:
        v = getattr(p, name)
        assert type(v) is float and math.isfinite(v)
    assert all(type(b) is float and abs(b) <= V.LOGIT_BIAS_LIMIT for b in p.logit_bias.values())
    assert all(type(t) is int and t >= 0 for t in p.stop_token_ids)
    assert all(isinstance(s, str) and s for s in p.stop)
    assert 1 <= p.n <= V.MAX_N
