"""The sampler's device math (runtime/sample_ops.py, runtime/noise.py) against straightforward
references: masks, penalties, temperature, and the counter-based noise."""

from __future__ import annotations

import math

import pytest
import torch

from radixserve.runtime import sample_ops as ops
from radixserve.runtime.noise import column_keys, exponential_noise, row_key, step_words

V = 64
CPU = torch.device("cpu")


def _probs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(n, V, generator=g)
    logits[0, :8] = 1.5  # ties: a boundary among equal probabilities
    return torch.softmax(logits, dim=-1)


def _ref_top_k_top_p(p: torch.Tensor, k: int, top_p: float) -> torch.Tensor:
    """One row, by hand: ids by descending probability (ties: lower id first), keep the first k,
    then stop once the kept mass reaches top_p."""
    order = sorted(range(V), key=lambda i: (-float(p[i]), i))
    keep: list[int] = []
    mass = 0.0
    for i in order[:k]:
        if top_p < 1.0 and mass >= top_p:
            break
        keep.append(i)
        mass += float(p[i])
    out = torch.zeros_like(p)
    out[keep] = p[keep]
    return out


@pytest.mark.parametrize(("k", "top_p"), [(V, 1.0), (5, 1.0), (V, 0.5), (3, 0.3), (1, 0.9), (V, 0.999)])
def test_top_k_top_p_keeps_what_the_reference_keeps(k: int, top_p: float) -> None:
    probs = _probs(6, k)
    got = ops.top_k_top_p(probs, torch.full((6, 1), k), torch.full((6, 1), top_p))
    for row in range(6):
        want = _ref_top_k_top_p(probs[row].double(), k, top_p).float()
        # Equal supports (float sums may differ at a boundary only within rounding: none here).
        assert torch.equal(got[row] > 0, want > 0), row
        assert torch.equal(got[row][got[row] > 0], probs[row][want > 0])


def test_top_k_top_p_rows_take_their_own_parameters() -> None:
    probs = _probs(3, 7)
    k = torch.tensor([[2], [V], [V]])
    top_p = torch.tensor([[1.0], [0.4], [1.0]])
    got = ops.top_k_top_p(probs, k, top_p)
    assert int((got[0] > 0).sum()) == 2
    assert torch.equal(got[2], probs[2])  # neutral parameters: every probability as it was
    assert torch.equal(got[1] > 0, _ref_top_k_top_p(probs[1].double(), V, 0.4) > 0)


def test_min_p_drops_tokens_below_its_share_of_the_best() -> None:
    probs = _probs(4, 3)
    min_p = torch.tensor([[0.0], [0.1], [0.5], [1.0]])
    got = ops.min_p_mask(probs, min_p)
    for row in range(4):
        bar = float(min_p[row]) * float(probs[row].max())
        want = torch.where(probs[row] >= bar, probs[row], 0.0)
        assert torch.equal(got[row], want)
    assert torch.equal(got[0], probs[0])


def _params(n: int, **cols: list[float]) -> torch.Tensor:
    par = torch.zeros(n, 8)
    par[:, ops.TEMP], par[:, ops.TOP_K], par[:, ops.TOP_P], par[:, ops.REP] = 1.0, V, 1.0, 1.0
    for name, values in cols.items():
        par[:, getattr(ops, name)] = torch.tensor(values)
    return par


def test_penalties_follow_transformers_and_openai() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, V, generator=g)
    counts = torch.randint(0, 3, (3, V), generator=g, dtype=torch.int32)
    seen = (counts > 0) | (torch.rand(3, V, generator=g) < 0.2)  # prompt tokens are seen too
    par = _params(3, REP=[1.3, 1.0, 0.8], FREQ=[0.0, 0.5, -0.2], PRES=[0.0, 0.7, 0.3])
    got = logits.clone()
    ops.apply_penalties(got, counts, seen, par)
    for r in range(3):
        rep, freq, pres = (float(par[r, c]) for c in (ops.REP, ops.FREQ, ops.PRES))
        for t in range(V):
            x = float(logits[r, t])
            if seen[r, t]:
                x = x / rep if x > 0 else x * rep
            x -= freq * int(counts[r, t]) + pres * (int(counts[r, t]) > 0)
            assert math.isclose(float(got[r, t]), x, rel_tol=1e-6, abs_tol=1e-6)


def test_neutral_penalties_leave_the_logits_bit_for_bit() -> None:
    logits = torch.randn(2, V)
    logits[0, 3] = float("-inf")
    got = logits.clone()
    ops.apply_penalties(
        got, torch.full((2, V), 5, dtype=torch.int32), torch.ones(2, V, dtype=torch.bool), _params(2)
    )
    assert torch.equal(got, logits)


def test_draw_is_the_exponential_race_over_the_tempered_distribution() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, V, generator=g)
    par = _params(4, TEMP=[0.5, 1.0, 2.0, 1.0], GREEDY=[0.0, 0.0, 0.0, 1.0])
    keys = torch.tensor([row_key(s) for s in (1, 2, 3, 4)])
    pos = torch.tensor([10, 11, 12, 13])
    cols = column_keys(V, CPU)
    got = ops.draw(logits, par, keys, pos, cols, top_k_p=False, min_p=False)
    noise = exponential_noise(step_words(keys, pos), cols)
    for r in range(3):
        p = torch.softmax(logits[r] / par[r, ops.TEMP], dim=-1)
        assert int(got[r]) == int((p / noise[r]).argmax())
    assert int(got[3]) == int(logits[3].argmax())  # a greedy row in a sampled step


@pytest.mark.parametrize("temp", [0.5, 1.0, 1.7])
def test_draws_over_positions_follow_the_distribution(temp: float) -> None:
    """Many positions of one key: the frequencies are those of softmax(logits / temp)."""
    n = 20000
    logits = torch.linspace(-2.0, 2.0, 8)
    cols = column_keys(8, CPU)
    par = _params(n, TEMP=[temp] * n)
    par[:, ops.TOP_K] = 8
    keys = torch.full((n,), row_key(5))
    ids = ops.draw(logits.expand(n, 8).clone(), par, keys, torch.arange(n), cols, top_k_p=False, min_p=False)
    freq = torch.bincount(ids, minlength=8).double() / n
    want = torch.softmax(logits.double() / temp, dim=-1)
    assert torch.allclose(freq, want, atol=4 * math.sqrt(0.25 / n))


def test_noise_is_a_function_of_key_and_position_alone() -> None:
    cols = column_keys(V, CPU)
    keys = torch.tensor([row_key(7), row_key(8), row_key(7)])
    noise = exponential_noise(step_words(keys, torch.tensor([3, 3, 4])), cols)
    alone = exponential_noise(step_words(keys[:1], torch.tensor([3])), cols)
    assert torch.equal(noise[0], alone[0])
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    big = exponential_noise(step_words(torch.tensor([row_key(-(2**70))]), torch.arange(2000)), cols)
    assert bool((big > 0).all()) and abs(float(big.mean()) - 1.0) < 0.02  # Exp(1): mean 1
    assert row_key(2**70) != row_key(0) and 0 <= row_key(-1) < 2**62
