"""`select` scores every choice on all of its tokens, and each choices method decides as a
reference computed from transformers' logprobs does: ours and SGLang's method objects.

Nine long choices (about 60 tokens each) are scored beside one another in more than one
prefill step (the engine's 512-token chunk), which once cut some choices' logprobs short.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import radixserve.lang as sgl
from radixserve import Engine

TOL = 1e-4
TAIL = (
    ", a city that sits beside a wide river with many old stone bridges, busy markets, quiet "
    "gardens, tall churches and small cafes where people talk about art, music, food, history "
    "and the weather for hours every single afternoon of the year, then walk home along the water "
    "under warm orange lights"
)
CITIES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Oslo", "Amsterdam"]
CHOICES = [c + TAIL for c in CITIES]


def _ask(s: Any) -> None:
    s += sgl.user("What is the capital of France? Describe it.")
    s += sgl.assistant_begin()
    s += "The answer is "


@sgl.function
def capital(s: Any, method: Any) -> None:
    _ask(s)
    s += sgl.select("city", choices=CHOICES, choices_method=method)


@sgl.function
def question(s: Any) -> None:
    _ask(s)  # no call to the model: the prompt `capital` selects after


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=True))


def _token_lps(hf_model: Any, ids: list[int], start: int) -> list[float]:
    """transformers' logprob of ids[p] given ids[:p], for p from `start` on."""
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [lp[p - 1, ids[p]].item() for p in range(start, len(ids))]


@pytest.fixture(scope="module")
def reference(engine: Engine, tokenizer: Any, hf_model: Any) -> dict[str, Any]:
    """Each choice's tokens after the prompt, scored with and without it, by transformers."""
    prompt = question.run().text()
    pids = _ids(tokenizer, prompt)
    cond, uncond, tokens = [], [], []
    for c in CHOICES:
        full = _ids(tokenizer, prompt + c)
        s = next(i for i, (a, b) in enumerate(zip(pids + [-1], full)) if a != b)
        tokens.append(full[s:])
        cond.append(_token_lps(hf_model, full, s))
        uncond.append([0.0, *_token_lps(hf_model, full[s:], 1)])  # the first token alone: 0
    assert min(len(t) for t in tokens) >= 60 and sum(len(t) for t in tokens) > 512
    return {"tokens": tokens, "cond": cond, "uncond": uncond}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _greedy(rows: list[list[float]]) -> int:
    width = max(map(len, rows))
    matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
    alive = list(range(len(rows)))
    for j in range(width):
        best = max(matrix[i][j] for i in alive)
        alive = [i for i in alive if matrix[i][j] == best]
        if len(alive) == 1:
            break
    return alive[0]


def _check_scores(meta: dict[str, Any], ref: dict[str, Any]) -> None:
    for got, ids, want in zip(meta["input_token_logprobs"], ref["tokens"], ref["cond"]):
        assert [t[1] for t in got] == ids  # every token of the choice, none more
        assert max(abs(t[0] - w) for t, w in zip(got, want)) < TOL
    for got_mean, want in zip(meta["normalized_prompt_logprobs"], ref["cond"]):
        assert abs(got_mean - _mean(want)) < TOL


def _run(method: Any) -> tuple[str, dict[str, Any]]:
    st = capital.run(method=method)
    assert st.text().endswith("The answer is " + st["city"])
    return st["city"], st.get_meta_info("city")


METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")


def _methods(module: Any) -> list[tuple[str, Any]]:
    return [(name, getattr(module, name)) for name in METHODS]


def _check_method(name: str, method: Any, ref: dict[str, Any]) -> None:
    picked, meta = _run(method)
    _check_scores(meta, ref)
    if name == "token_length_normalized":
        want = max(range(len(CHOICES)), key=lambda i: _mean(ref["cond"][i]))
    elif name == "greedy_token_selection":
        want = _greedy(ref["cond"])
    else:
        gains = [_mean([c - u for c, u in zip(cs, us)]) for cs, us in zip(ref["cond"], ref["uncond"])]
        for got, g in zip(meta["normalized_unconditional_prompt_logprobs"], gains):
            assert abs(got - g) < TOL
        for got, want_u in zip(meta["unconditional_token_logprobs"], ref["uncond"]):
            assert max(abs((t[0] or 0.0) - w) for t, w in zip(got, want_u)) < TOL
        want = max(range(len(CHOICES)), key=gains.__getitem__)
    assert picked == CHOICES[want], (name, picked[:12], CHOICES[want][:12])


@pytest.mark.parametrize("name", METHODS)
def test_each_method_decides_as_transformers_logprobs_do(eng: Engine, reference: Any, name: str) -> None:
    _check_method(name, dict(_methods(sgl))[name], reference)


def test_sglangs_own_method_objects_are_accepted(eng: Engine, reference: Any) -> None:
    sglang = pytest.importorskip("sglang", reason="sglang is not installed (pip install --no-deps sglang)")
    for name, method in _methods(sglang):
        assert type(method).__module__ == "sglang.lang.choices"
        _check_method(name, method, reference)
