"""The scheduling policy with a fake model: exact admission, caching, retraction and release.

The fake "model" samples a token that is a pure function of the whole
sequence so far, so any scheduling mistake (a wrong prefix, a lost token, a
retraction that changes the output) shows up as different tokens.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.runtime.runner import StepResult
from radixserve.runtime.step_batch import build_decode_batch
from radixserve.sampling_params import SamplingParams
from radixserve.sched.batch import Batch
from radixserve.sched.request import Request
from radixserve.sched.scheduler import NEED_SYNC, Scheduler, SchedulerConfig

VOCAB = 50
EOS = 0


def next_token(seq: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(seq)) * 2654435761) % VOCAB  # 0 is EOS


class FakeModel:
    """Checks the batch's KV bookkeeping, then 'samples' from the known sequences."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.kv: dict[int, int] = {}  # slot -> token id stored there (position-free fake KV)

    def step(self, batch: Batch, pending: dict[int, int]) -> StepResult:
        step = batch.step
        ids = step.input_ids.tolist()
        kv_indices = step.kv_indices
        if kv_indices is None:  # a decode step: its context comes from the table, as the runner builds it
            last = torch.zeros(64, dtype=torch.int64)
            fb = build_decode_batch(step, self.sched.kv.table.device_table, last, last.device)
            kv_indices = fb.kv_indices.numpy()
        off = 0
        kv_off = 0
        next_ids = []
        for req, p, e, s in zip(
            batch.reqs, step.prefix_lens.tolist(), step.extend_lens.tolist(), batch.sample
        ):
            ctx = kv_indices[kv_off : kv_off + p + e].tolist()
            for j in range(e):
                tok = ids[off + j]
                if tok < 0:
                    tok = pending[req.row]
                self.kv[int(step.out_slots[off + j])] = tok
            seq = [self.kv[slot] for slot in ctx]  # the request's whole context, read back from "KV"
            assert seq[: len(req.prompt_ids)] == req.prompt_ids[: len(seq)], "context slots hold wrong tokens"
            if s:
                tok = next_token(seq)
                next_ids.append(tok)
                pending[req.row] = tok
            off += e
            kv_off += p + e
        lps = [(-1.0, [])] * len(step.prompt_lp_targets) if step.prompt_lp_targets else None
        return StepResult(next_ids=next_ids, prompt_lps=lps)


def expected(prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        t = next_token(seq)
        out.append(t)
        seq.append(t)
        if t == EOS and not ignore_eos:
            break
    return out


def make(slots: int, **cfg: object) -> tuple[Scheduler, SlotAllocator]:
    alloc = SlotAllocator(slots)
    sched = Scheduler(SchedulerConfig(**cfg), alloc, RadixCache(alloc), ReqToSlotTable(64, 512))  # type: ignore[arg-type]
    return sched, alloc


def req(
    rid: str, prompt: list[int], max_tokens: int, arrival: int = 0, ignore_eos: bool = True, lp: bool = False
) -> Request:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos, prompt_logprobs=lp)
    return Request(rid, 0, list(prompt), params, frozenset({EOS}), 512, arrival=arrival)


_MODELS: dict[int, tuple[FakeModel, dict[int, int]]] = {}


def fake(sched: Scheduler) -> tuple[FakeModel, dict[int, int]]:
    """One fake model (its 'KV' and in-flight tokens) per scheduler."""
    return _MODELS.setdefault(id(sched), (FakeModel(sched), {}))


def drive(sched: Scheduler, overlap: bool, arrivals: dict[int, list[Request]]) -> dict[str, list[int]]:
    """Run to completion; `arrivals[k]` join before step k. Returns rid -> output tokens."""
    model, pending = fake(sched)
    outs: dict[str, list[int]] = {}
    last = None
    step = 0
    final_arrival = max(arrivals, default=0)
    arrivals = dict(arrivals)
    while True:
        for r in arrivals.pop(step, []):  # each joins once, whatever path the loop takes
            sched.add(r)
        batch = sched.schedule(inflight=last is not None)
        if batch is NEED_SYNC or (batch is None and last is not None):
            for o in sched.process(*last):
                outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
            last = None
            continue
        if batch is None:
            if not sched.has_work and step > final_arrival:
                break
            step += 1
            continue
        res = model.step(batch, pending)
        if overlap:
            if last is not None:
                for o in sched.process(*last):
                    outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
            last = (batch, res)
        else:
            for o in sched.process(batch, res):
                outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
        sched.check_integrity()
        step += 1
    if last is not None:
        for o in sched.process(*last):
            outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
    sched.check_integrity()
    return outs


def test_prefill_then_decode_and_kv_returns_to_the_tree() -> None:
    sched, alloc = make(100)
    r = req("a", [5, 6, 7, 8], 3)
    sched.add(r)
    batch = sched.schedule()
    assert (
        batch.is_prefill and batch.step.extend_lens.tolist() == [4] and batch.step.prefix_lens.tolist() == [0]
    )
    assert batch.step.out_slots.tolist() == [0, 1, 2, 3]
    model, pending = fake(sched)
    outs = sched.process(batch, model.step(batch, pending))
    assert outs[0].delta_token_ids == (next_token([5, 6, 7, 8]),)
    rest = drive(sched, False, {})
    assert outs[0].delta_token_ids[0:1] + tuple(rest["a"]) == tuple(expected([5, 6, 7, 8], 3))
    # Prompt and outputs but the last token have KV, all in the tree now.
    assert sched.cache.total_size == 4 + 3 - 1 and alloc.num_free == 100 - 6


def test_second_request_reuses_the_cached_prompt() -> None:
    sched, _ = make(100)
    drive(sched, False, {0: [req("a", list(range(1, 11)), 2)]})
    b = req("b", list(range(1, 11)) + [20, 21], 2)
    sched.add(b)
    batch = sched.schedule()
    assert batch.step.prefix_lens.tolist() == [10] and batch.step.extend_lens.tolist() == [2]  # "a" cached
    assert b.cached_tokens == 10


def test_request_sharing_an_uncached_prefix_waits_one_step() -> None:
    sched, _ = make(500, defer_shared_min=8)
    shared = list(range(1, 41))
    a, b = req("a", shared + [1], 1, 0), req("b", shared + [2], 1, 1)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    assert [r.rid for r in first.reqs] == ["a"]
    model, pending = fake(sched)
    sched.process(first, model.step(first, pending))
    second = sched.schedule()
    assert [r.rid for r in second.reqs] == ["b"] and second.step.prefix_lens.tolist() == [40]


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "prefill_first"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_random_workloads_give_exact_outputs_and_full_second_round_hits(
    overlap: bool, seed: int, mixed: bool
) -> None:
    rng = random.Random(seed)
    stems = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 30))] for _ in range(4)]
    prompts = [
        rng.choice(stems) + [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(12)
    ]
    lens = [rng.randint(1, 30) for _ in prompts]
    sched, alloc = make(10_000, chunked_prefill_size=rng.choice([8, 64, 1000]), mixed_steps=mixed)
    for rnd in range(2):
        arrivals: dict[int, list[Request]] = {}
        reqs = []
        for i, (p, n) in enumerate(zip(prompts, lens)):
            r = req(f"{rnd}-{i}", p, n, arrival=i, ignore_eos=False)
            reqs.append(r)
            arrivals.setdefault(rng.randint(0, 6), []).append(r)
        outs = drive(sched, overlap, arrivals)
        for i, r in enumerate(reqs):
            assert outs[r.rid] == expected(prompts[i], lens[i], ignore_eos=False), f"round {rnd} request {i}"
            if rnd == 1:
                assert r.cached_tokens == len(prompts[i]) - 1, f"request {i} hit {r.cached_tokens}"
    assert alloc.num_free + sched.cache.total_size == 10_000


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "prefill_first"])
@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_under_a_small_pool_keeps_outputs(overlap: bool, mixed: bool) -> None:
    rng = random.Random(1)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(5, 20))] for _ in range(10)]
    sched, alloc = make(80, decode_reserve_ratio=0.0, mixed_steps=mixed)
    # Half arrive while the first half decodes, so mixed steps admit into a dry pool.
    reqs = [req(str(i), p, 15, arrival=i, lp=i % 2 == 1) for i, p in enumerate(prompts)]
    outs = drive(sched, overlap, {0: reqs[:5], 3: reqs[5:]})
    assert sched.running.retractions > 0
    for i, r in enumerate(reqs):
        assert outs[r.rid] == expected(prompts[i], 15)
        # Each prompt token scored once, even by a request retracted and prefilled again.
        assert [t.token_id for t in r.prompt_logprobs] == (prompts[i][1:] if i % 2 else [])
    sched.cache.reset()
    assert alloc.num_free == 80


@pytest.mark.parametrize("overlap", [False, True])
def test_admissions_of_one_step_keep_each_others_decode_reserve(overlap: bool) -> None:
    """Three requests of 10 prompt tokens and 30 out (39 slots each at the end) queued at once
    into 100 slots, reserve ratio 1: the first goes alone, the second keeps both remaining 29s
    free (10 + 58 <= 90), the third would need 10 + 87 > 80 and waits. Counting only the
    running requests' reserve (none yet) let the third in, and the pool ran dry later."""
    sched, alloc = make(100, decode_reserve_ratio=1.0)
    prompts = [[i + 1] * 10 for i in range(3)]
    reqs = [req(str(i), p, 30, arrival=i) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add(r)
    first = sched.schedule()
    assert [r.rid for r in first.reqs] == ["0", "1"]
    model, pending = fake(sched)
    outs = {o.request_id: list(o.delta_token_ids) for o in sched.process(first, model.step(first, pending))}
    for rid, toks in drive(sched, overlap, {}).items():
        outs.setdefault(rid, []).extend(toks)
    assert sched.running.retractions == 0
    assert [outs[r.rid] for r in reqs] == [expected(p, 30) for p in prompts]
    sched.cache.reset()
    assert alloc.num_free == 100


def test_abort_while_waiting_and_running_frees_everything() -> None:
    sched, alloc = make(100)
    a, b = req("a", [1, 2, 3], 50), req("b", [4, 5, 6], 50)
    sched.add(a)
    batch = sched.schedule()
    model, pending = fake(sched)
    sched.process(batch, model.step(batch, pending))
    sched.add(b)
    sched.abort("a", "test")
    sched.abort("b", "test")
    aborted = sched.take_aborted()
    assert sorted(o.request_id for o in aborted) == ["a", "b"]
    assert all(o.finish_reason == "abort" and o.error == "test" for o in aborted)
    assert not sched.has_work
    sched.check_integrity()
    sched.cache.reset()
    assert alloc.num_free == 100


def test_prompt_goes_to_the_tree_at_prefill_and_decode_slots_stay_live() -> None:
    sched, _ = make(100)
    sched.add(req("a", [1, 2, 3, 4], 5))
    batch = sched.schedule()
    # The prompt's KV is in the tree (locked) as soon as it is scheduled.
    assert sched.cache.protected_size == 4 and sched.kv.live_slots(sched.running.reqs)[0].tolist() == []
    model, pending = fake(sched)
    sched.process(batch, model.step(batch, pending))
    sched.schedule()  # a decode step: one slot owned by the request alone
    assert torch.cat(sched.kv.live_slots(sched.running.reqs)).tolist() == [4]


@pytest.mark.parametrize("overlap", [False, True])
def test_long_queue_fcfs_still_shares_the_prefix(overlap: bool) -> None:
    # More waiting requests than lpm_max_queue: FCFS, matched only when reached.
    rng = random.Random(5)
    prefix = [rng.randrange(1, VOCAB) for _ in range(48)]
    prompts = [prefix + [rng.randrange(1, VOCAB) for _ in range(4)] for _ in range(12)]
    sched, alloc = make(5000, lpm_max_queue=2, defer_shared_min=8, chunked_prefill_size=64)
    reqs = [req(str(i), p, 3, arrival=i) for i, p in enumerate(prompts)]
    outs = drive(sched, overlap, {0: reqs})
    for i, r in enumerate(reqs):
        assert outs[r.rid] == expected(prompts[i], 3)
    hits = sorted(r.cached_tokens for r in reqs)
    assert hits[0] == 0 and all(h >= 48 for h in hits[1:])
    assert alloc.num_free + sched.cache.total_size == 5000


def test_a_prompt_larger_than_the_pool_is_aborted_not_spun_on() -> None:
    sched, alloc = make(16)
    sched.add(req("big", list(range(1, 40)), 2))
    sched.add(req("small", [1, 2, 3], 2, arrival=1))
    assert sched.schedule() is None
    (out,) = sched.take_aborted()
    assert out.request_id == "big" and out.finish_reason == "abort" and "KV cache" in out.error
    outs = drive(sched, False, {})
    assert outs["small"] == expected([1, 2, 3], 2)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "prefill_first"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_eviction_under_memory_pressure_keeps_outputs_exact(overlap: bool, seed: int, mixed: bool) -> None:
    # A pool far smaller than the work: ordering-time matches go stale as admissions evict.
    rng = random.Random(100 + seed)
    stems = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(8, 20))] for _ in range(3)]
    prompts = [
        rng.choice(stems) + [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 10))] for _ in range(16)
    ]
    sched, alloc = make(90, decode_reserve_ratio=0.0, mixed_steps=mixed)
    for rnd in range(3):
        reqs = [req(f"{rnd}-{i}", p, 6, arrival=i) for i, p in enumerate(prompts)]
        arrivals: dict[int, list[Request]] = {}
        for r in reqs:
            arrivals.setdefault(rng.randint(0, 3), []).append(r)
        outs = drive(sched, overlap, arrivals)
        for i, r in enumerate(reqs):
            assert outs[r.rid] == expected(prompts[i], 6), f"round {rnd} request {i}"
    assert alloc.num_free + sched.cache.total_size == 90


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "prefill_first"])
def test_decoders_get_a_token_every_step_of_a_chunked_prefill_only_when_mixed(
    overlap: bool, mixed: bool
) -> None:
    sched, _ = make(1000, chunked_prefill_size=16, mixed_steps=mixed)
    model, pending = fake(sched)
    a, b = req("a", [1, 2, 3], 40), req("b", [4, 5, 6, 7], 40, arrival=1)
    long = req("long", [(i * 7) % (VOCAB - 1) + 1 for i in range(100)], 3, arrival=2)
    sched.add(a)
    sched.add(b)
    outs: dict[str, list[int]] = {}
    steps: list[Batch] = []
    last = None
    for k in range(40):
        if k == 2:
            sched.add(long)  # arrives while a and b decode
        batch = sched.schedule(inflight=last is not None)
        assert isinstance(batch, Batch)
        steps.append(batch)
        res = model.step(batch, pending)
        if overlap:
            done, last = ([last] if last else []), (batch, res)
        else:
            done = [(batch, res)]
        for o in (o for d in done for o in sched.process(*d)):
            outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
        sched.check_integrity()
        if long.pending or long.output_ids:
            break
    prefill = [x for x in steps if long in x.reqs]
    assert len(prefill) >= 100 // 16 + 1, "the long prompt goes in chunks"
    # Mid-prefill it never samples; its last chunk does.
    assert [x.sample[x.reqs.index(long)] for x in prefill] == [False] * (len(prefill) - 1) + [True]
    assert all(x.step.num_tokens <= 16 for x in steps)
    if mixed:  # decode first: a and b sample a token in every step of the long prefill
        for x in prefill:
            assert a in x.reqs and b in x.reqs
            assert all(x.sample[x.reqs.index(r)] for r in (a, b))
    else:  # prefill first: a and b pause for every chunk
        assert not any(a in x.reqs or b in x.reqs for x in prefill)
    if last is not None:
        for o in sched.process(*last):
            outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
    rest = drive(sched, overlap, {})
    for r in (a, b, long):
        assert outs.get(r.rid, []) + rest.get(r.rid, []) == expected(r.prompt_ids, r.params.max_tokens)


def test_a_step_that_decodes_takes_at_most_mixed_prefill_tokens() -> None:
    """Alone, a prompt goes in whole chunks; beside a decoder, in pieces of `mixed_prefill_tokens`."""
    sched, _ = make(1000, chunked_prefill_size=64, mixed_prefill_tokens=8)
    model, pending = fake(sched)
    first = req("first", [(i * 5) % (VOCAB - 1) + 1 for i in range(50)], 12)
    later = req("later", [(i * 3) % (VOCAB - 1) + 1 for i in range(30)], 3, arrival=1)
    sched.add(first)
    steps: list[Batch] = []
    outs: dict[str, list[int]] = {}
    while sched.has_work:
        if len(steps) == 1:
            sched.add(later)  # arrives while `first` decodes
        batch = sched.schedule()
        assert isinstance(batch, Batch)
        steps.append(batch)
        for o in sched.process(batch, model.step(batch, pending)):
            outs.setdefault(o.request_id, []).extend(o.delta_token_ids)
        sched.check_integrity()
    assert steps[0].step.extend_lens.tolist() == [50], "nothing decodes yet: the whole prompt in one step"
    pieces = [
        int(x.step.extend_lens[x.reqs.index(later)]) for x in steps if later in x.reqs and first in x.reqs
    ]
    pieces = [n for n in pieces if n > 1]  # its prompt chunks (then it decodes too)
    assert pieces[:-1] == [8] * (len(pieces) - 1) and 0 < pieces[-1] <= 8, pieces
    assert sum(pieces) == len(later.prompt_ids) - later.cached_tokens
    for r in (first, later):
        assert outs[r.rid] == expected(r.prompt_ids, r.params.max_tokens)


def test_a_burst_of_prompts_beside_a_decoder_takes_whole_chunks() -> None:
    """More than a chunk of prompt tokens waiting: throughput first, whole chunks again."""
    sched, _ = make(1000, chunked_prefill_size=64, mixed_prefill_tokens=8)
    model, pending = fake(sched)
    sched.add(req("first", [3, 1, 4, 1, 5], 8))
    burst = [
        req(f"b{i}", [(i * 11 + j * 7) % (VOCAB - 1) + 1 for j in range(40)], 2, arrival=1) for i in range(3)
    ]
    steps: list[Batch] = []
    while sched.has_work:
        if len(steps) == 1:
            for r in burst:
                sched.add(r)
        batch = sched.schedule()
        assert isinstance(batch, Batch)
        steps.append(batch)
        sched.process(batch, model.step(batch, pending))
        sched.check_integrity()
    # 120 tokens wait: the first burst step fills the chunk beside the decoder; once no more
    # than a chunk waits, steps beside decoders take at most 8.
    assert steps[1].step.num_tokens == 64
    # (A prompt's last token may go as a decode row: a one-token row is no prefill piece.)
    pieces = [e for x in steps[2:] for e in x.step.extend_lens.tolist() if e > 1]
    assert pieces and all(e <= 8 for e in pieces), pieces


class ScoredRowsModel(FakeModel):
    """The fake model, noting the most prompt positions one step scored."""

    most_scored = 0

    def step(self, batch: Batch, pending: dict[int, int]) -> StepResult:
        self.most_scored = max(self.most_scored, len(batch.step.prompt_lp_targets or []))
        return super().step(batch, pending)


@pytest.mark.parametrize("overlap", [False, True])
def test_prompt_logprob_rows_per_step_stay_within_the_bound(overlap: bool) -> None:
    """A step scores at most `prompt_logprob_rows` prompt positions (each a float32 row over the
    vocabulary): long prompts asking prompt logprobs go in more chunks, every position scored
    once and in order; the part before `prompt_logprobs_start` and prompts without them are
    not cut."""
    rng = random.Random(3)
    sched, alloc = make(4000, prompt_logprob_rows=8, chunked_prefill_size=512)
    model = ScoredRowsModel(sched)
    _MODELS[id(sched)] = (model, {})
    prompts = [[rng.randrange(1, VOCAB) for _ in range(n)] for n in (300, 150, 40, 400, 200)]
    starts = [0, 100, 0, None, 180]  # None: no prompt logprobs
    reqs = []
    for i, (p, s) in enumerate(zip(prompts, starts)):
        params = SamplingParams(
            temperature=0,
            max_tokens=5,
            ignore_eos=True,
            prompt_logprobs=s is not None,
            prompt_logprobs_start=s or 0,
        )
        reqs.append(Request(str(i), 0, p, params, frozenset({EOS}), 512, arrival=i))
    outs = drive(sched, overlap, {0: reqs[:3], 2: reqs[3:]})
    assert 0 < model.most_scored <= 8
    for r, p, s in zip(reqs, prompts, starts):
        assert outs[r.rid] == expected(p, 5)
        assert [t.token_id for t in r.prompt_logprobs] == ([] if s is None else p[max(s, 1) :])
    sched.cache.reset()
    assert alloc.num_free == 4000
