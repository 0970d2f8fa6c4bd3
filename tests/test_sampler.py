"""The sampler on its own: bitmask, greedy rows in mixed batches, seeds, penalties."""

from __future__ import annotations

import torch
import xgrammar

from radixserve.runtime.sampler import Sampler, SamplingInputs
from radixserve.sampling_params import SamplingParams

V = 100


def inputs(params: list[SamplingParams], **kw: object) -> SamplingInputs:
    n = len(params)
    return SamplingInputs.from_requests(
        rows=list(range(n)), params=params, num_outputs=[0] * n, eos_ids=[frozenset()] * n, **kw
    )


def test_bitmask_restricts_every_row_to_its_allowed_tokens() -> None:
    sampler = Sampler(V, 4, torch.device("cpu"))
    logits = torch.randn(2, V)
    mask = xgrammar.allocate_token_bitmask(2, V)
    mask.zero_()
    mask[0, 0] = 1 << 7  # row 0 may only emit token 7
    mask[1, 1] = (1 << 3) | (1 << 5)  # row 1: tokens 35 and 37
    inp = inputs([SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1)])
    inp.bitmask = mask
    out = sampler(logits, inp).next_ids.tolist()
    assert out[0] == 7 and out[1] in (35, 37)


def test_greedy_rows_take_the_argmax_in_a_sampled_batch() -> None:
    sampler = Sampler(V, 4, torch.device("cpu"))
    logits = torch.randn(3, V)
    inp = inputs(
        [SamplingParams(temperature=0), SamplingParams(temperature=2.0), SamplingParams(temperature=0)]
    )
    out = sampler(logits, inp).next_ids
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seeded_draws_ignore_the_rest_of_the_batch() -> None:
    logits = torch.randn(1, V)
    p = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler(V, 4, torch.device("cpu"))(logits, inputs([p])).next_ids[0]
    batch = torch.cat([torch.randn(2, V), logits])
    mixed = Sampler(V, 4, torch.device("cpu"))(
        batch, inputs([SamplingParams(), SamplingParams(), p])
    ).next_ids[2]
    assert alone == mixed


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    sampler = Sampler(V, 1, torch.device("cpu"))
    logits = torch.full((1, V), -30.0)
    logits[0, 3], logits[0, 4] = 5.0, 4.9  # two tokens hold almost all the mass
    seen = {
        int(sampler(logits, inputs([SamplingParams(temperature=1.0, top_p=0.5, seed=s)])).next_ids[0])
        for s in range(20)
    }
    assert seen == {3}


def test_frequency_penalty_pushes_a_repeated_token_down() -> None:
    sampler = Sampler(V, 1, torch.device("cpu"))
    logits = torch.zeros(1, V)
    logits[0, 9], logits[0, 8] = 1.0, 0.9
    p = SamplingParams(temperature=0, frequency_penalty=0.5)
    first = sampler(logits, inputs([p], penalty_init=[(0, [])])).next_ids[0]
    second = sampler(logits, inputs([p])).next_ids[0]
    assert first == 9 and second == 8
