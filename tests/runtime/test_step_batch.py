"""A step's forward batch, built by the runner from its `StepInput`, equals the host-built one."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from radixserve.cache.req_table import ReqToSlotTable
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.sampler import SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.runtime.step_batch import build_decode_batch, build_forward_batch, gather_context

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_device_built_decode_batch_equals_host_concatenation(device: str, seed: int) -> None:
    rng = random.Random(seed)
    table = ReqToSlotTable(max_requests=16, max_context=64, device=device)
    rows = [table.alloc_row() for _ in range(16)]
    rng.shuffle(rows)
    bs = rng.randint(1, 16)
    picked = [r for r in rows[:bs] if r is not None]
    prefix = [rng.randint(0, 62) for _ in picked]
    ctx: list[torch.Tensor] = []
    for row, p in zip(picked, prefix):
        ctx.append(torch.tensor(rng.sample(range(10_000), p + 1)))
        table.write(row, 0, ctx[-1][:p])  # the prefix, as prefill and radix hits write it
    out_slots = np.array([int(c[-1]) for c in ctx], dtype=np.int64)
    ids = np.array([rng.choice([-1, rng.randrange(100)]) for _ in picked], dtype=np.int64)
    last = torch.randint(0, 100, (16,), device=device)
    rows_a = np.array(picked, dtype=np.int64)
    inp = StepInput.decode(
        rows_a, np.array(prefix, dtype=np.int64), out_slots, ids, SamplingInputs(rows_a, [], 0)
    )
    got = build_decode_batch(inp, table.device_table, last, torch.device(device))

    want_ids = [int(last[r]) if i < 0 else int(i) for r, i in zip(picked, ids)]
    want = ForwardBatch.build(want_ids, [1] * len(picked), prefix, ctx)
    for name in ("input_ids", "positions", "out_slots", "qo_indptr", "kv_indptr", "kv_indices"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype, name
        assert torch.equal(a.cpu(), b), name
    assert got.prefix_lens == prefix and got.extend_lens == [1] * len(picked)
    # The device gather, run on the CPU tensors, is the same concatenation.
    host_rows = torch.tensor(picked)
    seq = torch.tensor(prefix) + 1
    total = int(seq.sum())
    assert torch.equal(
        gather_context(table.device_table.cpu(), host_rows, seq, want.kv_indptr, total), want.kv_indices
    )
    # The new slot is recorded in the device table, so the next step reads it.
    for row, p, c in zip(picked, prefix, ctx):
        assert int(table.device_table[row, p]) == int(c[-1])


def test_table_write_mirrors_to_the_device_copy() -> None:
    table = ReqToSlotTable(max_requests=2, max_context=8, device="cpu")
    assert table.device_table is table.table  # on the CPU one tensor serves both
    if not torch.cuda.is_available():
        return
    gpu = ReqToSlotTable(max_requests=2, max_context=8, device="cuda")
    row = gpu.alloc_row()
    assert row is not None
    gpu.write(row, 2, torch.tensor([5, 6, 7]))
    assert gpu.device_table.device.type == "cuda"
    assert torch.equal(gpu.device_table.cpu(), gpu.table)
    other = gpu.alloc_row()
    for k in range(3):  # scatter's two pinned staging buffers, the first one reused
        gpu.scatter(np.array([row, other]), np.array([k, 7 - k]), np.array([10 + k, 20 + k]))
    assert torch.equal(gpu.device_table.cpu(), gpu.table)


@pytest.mark.parametrize("seed", range(4))
def test_host_listed_step_equals_forward_batch_build_and_takes_pending_ids_from_the_device(seed: int) -> None:
    """A step with `kv_indices` (prefill chunks beside decode rows): its forward batch is the
    host layout as is, a request's last id -1 comes from `last_tokens`, and the step's own
    arrays are left as they were."""
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    rows = np.array(rng.sample(range(16), n), dtype=np.int64)
    prefix = [rng.randint(0, 20) for _ in range(n)]
    extend = [rng.choice([1, rng.randint(1, 9)]) for _ in range(n)]
    ctx = [torch.tensor(rng.sample(range(10_000), p + e), dtype=torch.int32) for p, e in zip(prefix, extend)]
    ids = [rng.randrange(100) for _ in range(sum(extend))]
    last_pos = np.cumsum(extend) - 1
    pending = [i for i in range(n) if extend[i] == 1 and rng.random() < 0.5]
    for i in pending:
        ids[last_pos[i]] = -1
    last = torch.randint(0, 100, (16,))
    logit_rows = np.array(sorted(rng.sample(range(sum(extend)), min(2, sum(extend)))), dtype=np.int64)
    step = StepInput(
        rows=rows,
        prefix_lens=np.array(prefix, dtype=np.int64),
        extend_lens=np.array(extend, dtype=np.int64),
        input_ids=np.array(ids, dtype=np.int64),
        out_slots=np.concatenate([c[p:].numpy() for c, p in zip(ctx, prefix)]).astype(np.int64),
        kv_indices=torch.cat(ctx).numpy(),
        sampling=SamplingInputs(rows, [], 0),
        logit_rows=logit_rows,
    )
    got = build_forward_batch(step, None, last, torch.device("cpu"))

    want_ids = list(ids)
    for i in pending:
        want_ids[last_pos[i]] = int(last[rows[i]])
    want = ForwardBatch.build(want_ids, extend, prefix, ctx, logit_rows=torch.from_numpy(logit_rows))
    for name in ("input_ids", "positions", "out_slots", "qo_indptr", "kv_indptr", "kv_indices", "logit_rows"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert got.prefix_lens == prefix and got.extend_lens == extend
    assert step.input_ids.tolist() == ids  # the -1s stay in the step's own array


def test_a_step_without_kv_indices_brings_one_token_per_request() -> None:
    rows = np.array([0, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="one token per request"):
        StepInput(
            rows=rows,
            prefix_lens=np.array([3, 4], dtype=np.int64),
            extend_lens=np.array([1, 2], dtype=np.int64),
            input_ids=np.zeros(3, dtype=np.int64),
            out_slots=np.zeros(3, dtype=np.int64),
            kv_indices=None,
            sampling=SamplingInputs(rows, [], 0),
        )
    with pytest.raises(RuntimeError, match="slot table"):
        build_forward_batch(
            StepInput.decode(rows, rows, rows, rows, SamplingInputs(rows, [], 0)), None, torch.zeros(2), "cpu"
        )
