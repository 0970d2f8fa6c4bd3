"""The sampler on its own: bitmask, greedy rows in mixed batches, seeds, penalties, the
all-greedy fast path (bf16 logits, ties) and which rows count as non-finite."""

from __future__ import annotations

import pytest
import torch
import xgrammar

from radixserve.runtime.sampler import INVALID_TOKEN, Sampler, SamplingInputs
from radixserve.sampling_params import SamplingParams

V = 100


def at(*positions: int) -> torch.Tensor:
    """The positions of the rows' last input tokens (they key the sampled rows' noise)."""
    return torch.tensor(positions, dtype=torch.int64)


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
    out = sampler(logits, inp, positions=at(3, 3)).next_ids.tolist()
    assert out[0] == 7 and out[1] in (35, 37)


def test_greedy_rows_take_the_argmax_in_a_sampled_batch() -> None:
    sampler = Sampler(V, 4, torch.device("cpu"))
    logits = torch.randn(3, V)
    inp = inputs(
        [SamplingParams(temperature=0), SamplingParams(temperature=2.0), SamplingParams(temperature=0)]
    )
    out = sampler(logits, inp, positions=at(0, 1, 2)).next_ids
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_all_greedy_bf16_logits_take_the_first_of_tied_maxima() -> None:
    logits = torch.randn(4, V + 28).to(torch.bfloat16)  # padded vocabulary: columns >= V ignored
    logits[0, 10] = logits[0, 60] = 50.0  # a tie: the first index wins
    logits[1, V + 3] = 99.0  # beyond the vocabulary
    logits[2, 5:9] = 50.0
    sampler = Sampler(V, 4, torch.device("cpu"))
    out = sampler(logits, inputs([SamplingParams(temperature=0)] * 4)).next_ids
    assert out.dtype == torch.int64
    assert out.tolist() == logits[:, :V].float().argmax(dim=-1).tolist()
    assert out[0] == 10 and out[2] == 5


FAULT_PATHS = {
    "greedy": SamplingParams(temperature=0),
    "greedy_logprobs": SamplingParams(temperature=0, logprobs=True),
    "sampled": SamplingParams(temperature=1.0, seed=3),
}


@pytest.mark.parametrize("path", FAULT_PATHS)
def test_non_finite_rows_are_invalid_but_a_minus_inf_entry_is_not(path: str) -> None:
    logits = torch.randn(5, V)
    logits[1, 7] = float("nan")
    logits[2, 7] = float("inf")
    logits[3] = float("-inf")
    logits[4, ::2] = float("-inf")  # probability 0 for every even id; the rest is a fine row
    sampler = Sampler(V, 5, torch.device("cpu"))
    out = sampler(logits, inputs([FAULT_PATHS[path]] * 5), positions=at(*range(5))).next_ids.tolist()
    assert out[1:4] == [INVALID_TOKEN] * 3
    assert out[0] >= 0 and out[4] >= 0 and out[4] % 2 == 1
    if path != "sampled":
        assert out[0] == logits[0].argmax() and out[4] == logits[4].argmax()


def test_seeded_draws_ignore_the_rest_of_the_batch() -> None:
    logits = torch.randn(1, V)
    p = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler(V, 4, torch.device("cpu"))(logits, inputs([p]), positions=at(9)).next_ids[0]
    batch = torch.cat([torch.randn(2, V), logits])
    mixed = Sampler(V, 4, torch.device("cpu"))(
        batch, inputs([SamplingParams(), SamplingParams(), p]), positions=at(4, 30, 9)
    ).next_ids[2]
    assert alone == mixed


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    sampler = Sampler(V, 1, torch.device("cpu"))
    logits = torch.full((1, V), -30.0)
    logits[0, 3], logits[0, 4] = 5.0, 4.9  # two tokens hold almost all the mass
    seen = {
        int(
            sampler(
                logits, inputs([SamplingParams(temperature=1.0, top_p=0.5, seed=s)]), positions=at(0)
            ).next_ids[0]
        )
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


def _context_logits(seq: list[int]) -> torch.Tensor:
    """A fake model: logits that are a pure function of the whole sequence."""
    g = torch.Generator().manual_seed(hash(tuple(seq)) & 0xFFFFFFFF)
    return 3 * torch.randn(V, generator=g)


def _serve_one_at_a_time(params: list[SamplingParams]) -> list[list[int]]:
    """Run requests through a scheduler with ONE row, one after the other: each takes the
    row the previous one left, with the sampler's per-row state on it."""
    from radixserve.cache.allocator import SlotAllocator
    from radixserve.cache.radix_tree import RadixCache
    from radixserve.cache.req_table import ReqToSlotTable
    from radixserve.runtime.runner import StepResult
    from radixserve.sched.batch import Batch
    from radixserve.sched.request import Request
    from radixserve.sched.scheduler import Scheduler, SchedulerConfig

    alloc = SlotAllocator(256)
    cfg = SchedulerConfig(max_running_requests=1)
    sched = Scheduler(cfg, alloc, RadixCache(alloc), ReqToSlotTable(1, 64))
    sampler = Sampler(V, 1, torch.device("cpu"))
    reqs = [Request(f"r{i}", 0, [5, 6, 7], p, frozenset({0}), 64, arrival=i) for i, p in enumerate(params)]
    for r in reqs:
        sched.add(r)
    while sched.has_work:
        batch = sched.schedule()
        assert isinstance(batch, Batch)
        sampling_reqs = [r for r, s in zip(batch.reqs, batch.sample) if s]
        logits = torch.stack([_context_logits(r.all_ids) for r in sampling_reqs]) if sampling_reqs else None
        last = batch.step.prefix_lens + batch.step.extend_lens - 1  # each request's last token
        positions = torch.as_tensor(last[[i for i, s in enumerate(batch.sample) if s]])
        ids = (
            sampler(logits, batch.step.sampling, positions=positions).next_ids.tolist()
            if logits is not None
            else []
        )
        sched.process(batch, StepResult(next_ids=ids))
    sched.check_integrity()
    return [r.output_ids for r in reqs]


def test_a_reused_row_does_not_inherit_the_previous_requests_state() -> None:
    first = SamplingParams(
        temperature=0.9,
        top_k=5,
        seed=7,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        logit_bias={3: 2.0},
        min_tokens=3,
        max_tokens=6,
    )
    penalized = SamplingParams(temperature=0, presence_penalty=0.8, max_tokens=6)
    sampled = SamplingParams(temperature=0.5, top_p=0.9, seed=11, max_tokens=6)
    together = _serve_one_at_a_time([first, penalized, sampled])
    alone = [_serve_one_at_a_time([p])[0] for p in (first, penalized, sampled)]
    assert together == alone
