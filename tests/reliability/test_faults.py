"""Fault injection and values that once crashed the worker (issue 8, items 1 and 8).

Per-request faults (NaN logits of one row, a detokenizer that raises, a tokenizer that raises
in the caller) fail only the request they touch; concurrent requests still equal transformers'
greedy output and the engine stays healthy. An exception in the batched forward makes the engine
declare itself unhealthy and fail every waiter (tests/reliability/test_lifecycle.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, Engine, SamplingParams
from radixserve.local_engine import LocalEngine
from radixserve.testing import inject_faults

from .conftest import hf_greedy

pytestmark = pytest.mark.timeout(300)

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
MARK_SEED = 4242  # requests with this seed are the ones a hook breaks


def _run_with_bystander(engine: Engine, ids: list[int], victim: Any) -> tuple[Any, Any]:
    """A greedy bystander and the victim request, concurrently; both resolve within 120 s."""

    async def body(eng: AsyncEngine) -> tuple[Any, Any]:
        both = asyncio.gather(eng.complete(ids, GREEDY), victim(eng), return_exceptions=True)
        return tuple(await asyncio.wait_for(both, timeout=120))  # type: ignore[return-value]

    return engine.run(body(engine.engine))  # type: ignore[no-any-return]


def _healthy_after(engine: Engine) -> None:
    assert engine.healthy
    engine.check_integrity()


def test_values_that_crashed_the_worker_now_complete(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("The weather today is")
    ref = hf_greedy(hf_model, ids, 12)
    # item 1: top_k beyond int64 (clamped to the vocabulary in the sampler)
    base, out = _run_with_bystander(
        engine, ids, lambda e: e.complete("hi", SamplingParams(top_k=2**64, max_tokens=4, temperature=0.8))
    )
    assert list(base.token_ids) == ref[: len(base.token_ids)] and len(base.token_ids) == 12
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    # top_k = 2**64 with temperature 0.8 is plain sampling: same tokens as top_k=-1 under one seed
    s = SamplingParams(max_tokens=6, temperature=0.8, seed=3)
    assert engine.complete(ids, s.replace(top_k=2**64)).token_ids == engine.complete(ids, s).token_ids
    # item 8: a tiny temperature is greedy, not NaN probabilities (token 0 repeated)
    tiny = engine.complete(ids, SamplingParams(temperature=1e-45, max_tokens=12, ignore_eos=True))
    assert list(tiny.token_ids) == ref
    # ints that fit a float are converted, not passed through
    rp = engine.complete(ids, SamplingParams(temperature=0, max_tokens=6, repetition_penalty=2))
    assert list(rp.token_ids) == hf_greedy(hf_model, ids, 6, repetition_penalty=2.0)
    _healthy_after(engine)


def test_non_finite_logits_fail_only_that_request(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    """A NaN row (a sampled victim with logprobs) and a +inf entry (a greedy victim, injected
    at an all-greedy step: the sampler's one-reduction path) abort only their request; the
    bystander's rows get -inf on their lower half at every step, which is probability 0, not a
    fault: it still equals transformers' greedy output."""
    ids = tokenizer.encode("A list of prime numbers:")
    ref = hf_greedy(hf_model, ids, 12)
    marks = {"nan": MARK_SEED, "inf": MARK_SEED + 1, "bystander": MARK_SEED + 2}
    hits: dict[str, list[bool]] = {k: [] for k in marks}  # per injection: was the step all greedy

    def faults(step: int, logits: torch.Tensor, sampling: Any) -> torch.Tensor:
        logits = logits.clone()
        for i, p in enumerate(sampling.params):
            kind = next((k for k, seed in marks.items() if p.seed == seed), None)
            if kind is None or (kind != "bystander" and hits[kind]):
                continue  # each victim is hit once
            if kind == "inf" and not sampling.all_greedy:
                continue  # wait for a step without the sampled victim
            hits[kind].append(sampling.all_greedy)
            row = logits[i]
            if kind == "nan":
                row.fill_(float("nan"))
            elif kind == "inf":
                row[7] = float("inf")
            else:
                row.masked_fill_(row < row.median(), float("-inf"))
        return logits

    async def body(eng: AsyncEngine) -> tuple[Any, ...]:
        greedy = GREEDY.replace(seed=marks["bystander"])
        nan = SamplingParams(temperature=0.7, seed=marks["nan"], max_tokens=20, logprobs=True)
        inf = SamplingParams(temperature=0, seed=marks["inf"], max_tokens=20, ignore_eos=True)
        reqs = (eng.complete(ids, greedy), eng.complete("Tell me a story", nan), eng.complete("Hi", inf))
        both = asyncio.gather(*reqs, return_exceptions=True)
        return tuple(await asyncio.wait_for(both, timeout=120))

    inject_faults(engine, faults)
    try:
        base, nan_out, inf_out = engine.run(body(engine.engine))
    finally:
        inject_faults(engine, None)
    assert hits["nan"] and hits["inf"] == [True] and True in hits["bystander"], hits
    for out in (nan_out, inf_out):
        assert out.finish_reason == "abort" and "non-finite" in (out.error or ""), out
    assert list(base.token_ids) == ref
    _healthy_after(engine)


class _FlakyTokenizer:
    """The real tokenizer, except that decoding `bad_id` or encoding "BOOM" raises."""

    def __init__(self, real: Any, bad_id: int) -> None:
        self.real, self.bad_id = real, bad_id

    def decode(self, ids: list[int], **kw: Any) -> str:
        if self.bad_id in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected decode fault")
        return str(self.real.decode(ids, **kw))

    def encode(self, text: str, **kw: Any) -> list[int]:
        if "BOOM" in text:
            raise RuntimeError("injected encode fault")
        return list(self.real.encode(text, **kw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_tokenizer_errors_fail_only_that_request(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("Three colors are")
    ref = hf_greedy(hf_model, ids, 12)
    bad_id = 1234
    eng = engine.engine._core  # the one engine itself: the test swaps what it loaded
    assert isinstance(eng, LocalEngine)
    assert eng.scheduler is not None and eng.loaded is not None
    real, loaded = eng.scheduler.outputs.tokenizer, eng.loaded
    flaky = _FlakyTokenizer(real, bad_id)
    eng.scheduler.outputs.tokenizer = flaky  # what the worker detokenizes with
    eng.loaded = replace(loaded, tokenizer=flaky)  # what the caller encodes with
    try:
        forced = SamplingParams(temperature=0, max_tokens=8, logit_bias={bad_id: 100.0})
        base, out = _run_with_bystander(engine, ids, lambda e: e.complete("Hello", forced))
        with pytest.raises(ValueError, match="tokenizer failed"):
            engine.complete("BOOM goes the tokenizer", SamplingParams(max_tokens=2))
    finally:
        eng.scheduler.outputs.tokenizer = real
        eng.loaded = loaded
    assert out.finish_reason == "abort" and "injected decode fault" in (out.error or ""), out
    assert list(base.token_ids) == ref
    _healthy_after(engine)
    assert engine.complete(ids, GREEDY).token_ids == tuple(ref)


def test_hook_sees_steps_in_order_and_can_be_removed(engine: Engine) -> None:
    seen: list[int] = []

    def record(step: int, logits: torch.Tensor, sampling: Any) -> torch.Tensor:
        seen.append(step)
        return logits

    inject_faults(engine, record)
    try:
        engine.complete("Count:", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    finally:
        inject_faults(engine, None)
    assert len(seen) >= 5 and seen == sorted(seen) and len(set(seen)) == len(seen)
    n = len(seen)
    engine.complete("Count:", SamplingParams(temperature=0, max_tokens=3))
    assert len(seen) == n
