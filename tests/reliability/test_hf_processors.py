"""min_tokens, stop ids, logit bias and top-k against transformers' own logits processors
(issue 8, item 11). Greedy after a deterministic processor must match token for token."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TopKLogitsWarper,
)

from radixserve import Engine, SamplingParams

pytestmark = pytest.mark.timeout(300)

EOS = 2  # SmolLM2's <|im_end|>


def _hf(model: Any, ids: list[int], n: int, processors: list[Any], eos: list[int] | None = None) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=n,
            pad_token_id=EOS,
            eos_token_id=eos or [EOS],
            logits_processor=LogitsProcessorList(processors),
        )
    return list(out[0, len(ids) :].tolist())


def _chat(tokenizer: Any, q: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_min_tokens_matches_min_new_tokens_processor(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = _chat(tokenizer, "What is 12 times 12?")
    free = engine.complete(ids, SamplingParams(temperature=0, max_tokens=64))
    assert free.finish_reason == "stop" and free.token_ids[-1] == EOS
    n_free = len(free.token_ids) - 1  # tokens before EOS
    exact_end = 0
    for m in (n_free, n_free + 1):
        ours = engine.complete(ids, SamplingParams(temperature=0, max_tokens=m + 2, min_tokens=m))
        ref = _hf(hf_model, ids, m + 2, [MinNewTokensLengthLogitsProcessor(len(ids), m, EOS)])
        assert list(ours.token_ids) == ref, m
        exact_end += len(ref) == m + 1 and ref[-1] == EOS
    # EOS right where suppression ends: suppressing one step too long would change these
    assert exact_end >= 1


def test_stop_token_ids_match_eos_list_and_are_suppressed_under_min_tokens(
    engine: Engine, tokenizer: Any, hf_model: Any
) -> None:
    ids = tokenizer.encode("Once upon a time, in a land far away,")
    base = engine.complete(ids, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    stop = base.token_ids[4]
    ours = engine.complete(ids, SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop]))
    assert list(ours.token_ids) == _hf(hf_model, ids, 16, [], eos=[EOS, stop])
    assert ours.finish_reason == "stop" and ours.stop_reason == stop
    m = base.token_ids.index(stop) + 2
    p = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop], min_tokens=m)
    ref = _hf(
        hf_model, ids, 16, [MinNewTokensLengthLogitsProcessor(len(ids), m, [EOS, stop])], eos=[EOS, stop]
    )
    assert list(engine.complete(ids, p).token_ids) == ref


def test_logit_bias_matches_sequence_bias_processor(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("My favourite fruit is")
    base = engine.complete(ids, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    the = tokenizer.encode(" the")[0]
    for bias in ({base.token_ids[0]: -5.0}, {the: 4.0, base.token_ids[2]: -3.5}, {base.token_ids[1]: 2.5}):
        ours = engine.complete(
            ids, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logit_bias=bias)
        )
        proc = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})
        ref = _hf(hf_model, ids, 10, [proc], eos=[-1])
        assert list(ours.token_ids) == ref, bias
    assert list(ours.token_ids) != list(base.token_ids)


def test_sampled_tokens_stay_within_top_k_warper(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("Here is a random word:")
    for k, seed in ((3, 1), (8, 2)):
        out = engine.complete(
            ids, SamplingParams(temperature=1.5, top_k=k, seed=seed, max_tokens=12, ignore_eos=True)
        )
        seq = torch.tensor([ids + list(out.token_ids)])
        with torch.no_grad():
            logits = hf_model(seq).logits[0, len(ids) - 1 : -1].float()
        warper = TopKLogitsWarper(k)
        for step, tok in enumerate(out.token_ids):
            kept = warper(seq[:, : len(ids) + step], logits[step : step + 1])[0]
            assert torch.isfinite(kept[tok]), (k, step, tok)
            assert int(torch.isfinite(kept).sum()) == k
