"""A decode step built on the device from the request-to-slot table equals the host-built one."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from radixserve.cache.req_table import ReqToSlotTable
from radixserve.runtime.decode_inputs import build_decode_batch, gather_context
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.step import DecodeInputs

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
    inp = DecodeInputs(
        rows=np.array(picked, dtype=np.int64),
        prefix_lens=np.array(prefix, dtype=np.int64),
        out_slots=out_slots,
        input_ids=ids,
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
