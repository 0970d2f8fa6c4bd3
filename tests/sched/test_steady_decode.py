"""The steady decode set (sched/steady.py) builds the same decode steps as the general path.

Every decode batch is checked against what the general path asks of each request
(`can_decode`, the positions that key the seeded rows' noise), while requests finish at different
lengths or on EOS, one is aborted mid-decode and others arrive late; the outputs
must be the fake model's sequences and every slot accounted for at the end.
"""

from __future__ import annotations

import math

import pytest

from radixserve.sampling_params import SamplingParams
from radixserve.sched.batch import Batch
from radixserve.sched.request import Request
from radixserve.sched.scheduler import NEED_SYNC, Scheduler
from tests.sched.test_scheduler import EOS, expected, fake, make


def sampled(
    rid: str, prompt: list[int], max_tokens: int, seed: int | None, ignore_eos: bool = True
) -> Request:
    p = SamplingParams(temperature=0.7, top_p=0.9, seed=seed, max_tokens=max_tokens, ignore_eos=ignore_eos)
    return Request(rid, 0, list(prompt), p, frozenset({EOS}), 512)


def checked_schedule(sched: Scheduler, inflight: bool) -> object:
    want = [r for r in sched.running.reqs if r.can_decode]
    ratio = sched.cfg.decode_reserve_ratio
    reserve = sum(math.ceil(r.remaining_tokens * ratio) for r in sched.running.reqs)
    assert sched.running.decode_reserve() == reserve
    last = [r.num_tokens - 1 for r in want]  # before schedule() counts the token it samples
    batch = sched.schedule(inflight=inflight)
    if isinstance(batch, Batch) and batch.step.is_decode:  # a plain decode step
        assert batch.reqs == want
        # The position of each request's last token: it keys a seeded request's noise.
        assert batch.step.prefix_lens.tolist() == [r.kv_len - 1 for r in want]
        assert batch.step.prefix_lens.tolist() == last
    return batch


@pytest.mark.parametrize("overlap", [False, True])
def test_steady_decode_matches_general_path(overlap: bool) -> None:
    sched, alloc = make(4096, cascade_min_shared=4)
    model, pending = fake(sched)
    prompt = [7, 3, 9, 4, 1, 8]
    reqs = [
        sampled(f"r{i}", prompt[: 3 + i % 4] + [i], 3 + 2 * i, seed=i if i % 3 else None) for i in range(8)
    ]
    reqs.append(sampled("eos", [5, 5, 2], 40, seed=None, ignore_eos=False))
    late = [sampled(f"late{i}", prompt + [i], 6, seed=10 + i) for i in range(2)]
    for r in reqs:
        sched.add(r)
    outs: dict[str, list[int]] = {}
    last = None
    steps = 0

    def process(batch: object, res: object) -> None:
        for o in sched.process(batch, res):  # type: ignore[arg-type]
            outs.setdefault(o.request_id, []).extend(o.delta_token_ids)

    while sched.has_work or last is not None:
        steps += 1
        if steps == 6:
            sched.abort("r7", "test")
        if steps == 9:
            for r in late:
                sched.add(r)
        batch = checked_schedule(sched, last is not None)
        if batch is NEED_SYNC or batch is None:
            assert last is not None
            process(*last)
            last = None
            continue
        res = model.step(batch, pending)  # type: ignore[arg-type]
        if overlap:
            if last is not None:
                process(*last)
            last = (batch, res)
        else:
            process(batch, res)
        sched.check_integrity()
    sched.check_integrity()
    assert sched.running.steady.active is False or not sched.running.reqs
    for r in reqs[:7] + late:
        assert outs[r.rid] == expected(r.prompt_ids, r.params.max_tokens), r.rid
    assert outs["eos"] == expected([5, 5, 2], 40, ignore_eos=False)
    assert reqs[7].finish_reason == "abort"
    assert alloc.num_free + sched.cache.evictable_size + sched.cache.protected_size == alloc.num_slots  # type: ignore[union-attr]
