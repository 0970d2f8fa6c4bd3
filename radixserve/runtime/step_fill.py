"""A decode step's whole input in one Triton launch, graph-capturable.

`build_decode_batch` plus `DecodeGraphs.run`'s copies and padding are ~30 small
torch launches per step. Here the host packs the step's per-request arrays
into one pinned int64 buffer (`StepFillStaging.upload`: one non_blocking H2D
copy), and one kernel (`step_fill`) writes every input of a graph of `bs`
rows into fixed buffers and records each new slot in the request-to-slot
table. The launch has a fixed grid (one program per graph row), reads nothing
on the host and allocates nothing, so it can run inside the captured graph.

Packed layout, for a capacity `cap` (the largest graph size), int64:

    [n, ids[cap], rows[cap], prefix_lens[cap], out_slots[cap], kv_indptr[cap + 1]]

`n` real requests (n <= bs); `ids[i] == -1`: take `last_tokens[rows[i]]`
(still being sampled by the previous step); `kv_indptr` is the exclusive
prefix sum of `prefix_lens + 1` (from the host, which knows the lengths:
FlashInfer's plan needs them there too). Entries at and beyond n (kv_indptr:
beyond n + 1) are ignored.

What one launch writes, for rows i < bs:

    input_ids[i]   int64  ids[i] (or last_tokens[rows[i]]); 0 for padding
    positions[i]   int64  prefix_lens[i]; 0 for padding
    out_slots[i]   int64  out_slots[i]; `scratch` for padding
    kv_indptr[i+1] int32  kv_indptr[i+1]; padding rows continue by +1 each
    kv_indices     int32  row i's segment: table[rows[i], :prefix_lens[i]] then out_slots[i];
                          a padding row's segment is the one slot `scratch`
    table[rows[i], prefix_lens[i]] = out_slots[i]   (int32; real rows only)

which is exactly `build_decode_batch` followed by `DecodeGraphs.run`'s padding
(tests/runtime/test_step_fill.py checks it under the Triton interpreter).
The rows are `packed[1 + cap : 1 + cap + n]` (`StepFillStaging.rows`), a view
the sampler can take as the step's device rows.

Use from `DecodeGraphs` (CUDA only: importing this module imports triton):

    staging = StepFillStaging(cap=max_bs, device=device)           # once
    kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
    kv_indices = torch.zeros(max_kv_tokens, dtype=torch.int32, device=device)
    fill = lambda bs: step_fill(                                   # per graph size bs:
        staging.device_buf, max_bs, last_tokens, table,            # call it in the warm-up
        input_ids[:bs], positions[:bs], out_slots[:bs],            # (the first call compiles),
        kv_indptr[: bs + 1], kv_indices, scratch)                  # then inside the capture,
                                                                   # before the model
    staging.upload(step)  # a decode StepInput, per step; then replay graph bs (replay stream)

`table` is `ReqToSlotTable.device_table` and `last_tokens` the runner's buffer, both at
fixed addresses already. `kv_indices` must hold `sum(prefix_lens) + bs` entries (the
graph's `max_kv_tokens`); the kernel cannot check it without a host read. With FlashInfer,
`kv_indptr`/`kv_indices` can be the graph state's own buffers (`state.kv_indptr`,
`state.kv_indices`), which its decode kernel reads; its plan still runs on the host from
`prefix_lens` padded with zeros, as now (its copies into those buffers write the same values).
`staging.rows[:n]` is valid as the step's rows until the next upload is queued (stream
order: the worker samples step k before it launches step k + 1).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from radixserve.host_copy import PinnedStaging
from radixserve.runtime.step import StepInput


@triton.jit
def _step_fill_kernel(
    Packed,
    LastTokens,
    Table,
    InputIds,
    Positions,
    OutSlots,
    KvIndptr,
    KvIndices,
    table_stride,
    scratch,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per graph row i; rows at and beyond n are padding."""
    i = tl.program_id(0)
    n = tl.load(Packed)
    real = i < n
    ids = Packed + 1
    rows = ids + CAP
    lens = rows + CAP
    slots = lens + CAP
    indptr = slots + CAP
    tok = tl.load(ids + i, mask=real, other=0)
    row = tl.load(rows + i, mask=real, other=0)
    p = tl.load(lens + i, mask=real, other=0)
    slot = tl.load(slots + i, mask=real, other=scratch)
    # Padding rows follow the last real row, one scratch slot each.
    start = tl.where(real, tl.load(indptr + i, mask=real, other=0), tl.load(indptr + n) + (i - n))
    last = tl.load(LastTokens + row, mask=real & (tok < 0), other=0)
    tl.store(InputIds + i, tl.where(tok < 0, last, tok))
    tl.store(Positions + i, p)
    tl.store(OutSlots + i, slot)
    tl.store(KvIndptr + i + 1, (start + p + 1).to(tl.int32))
    if i == 0:
        tl.store(KvIndptr, start.to(tl.int32))
    src = Table + row * table_stride
    for off in range(0, p, BLOCK):  # the context already in the pool (empty for padding)
        offs = off + tl.arange(0, BLOCK)
        mask = offs < p
        tl.store(KvIndices + start + offs, tl.load(src + offs, mask=mask), mask=mask)
    tl.store(KvIndices + start + p, slot.to(tl.int32))
    tl.store(src + p, slot.to(tl.int32), mask=real)


def step_fill(
    packed: torch.Tensor,
    cap: int,
    last_tokens: torch.Tensor,
    table: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_slots: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scratch: int,
    block: int = 256,
) -> None:
    """Launch the fill for a graph of `bs = len(input_ids)` rows (see the module docstring).

    Checks only what the host already knows (shapes, dtypes): nothing here reads the device.
    """
    bs = input_ids.numel()
    if not 1 <= bs <= cap:
        raise ValueError(f"graph size {bs} outside [1, cap={cap}]")
    if packed.numel() != packed_size(cap) or packed.dtype != torch.int64:
        raise ValueError(f"packed must be int64 [{packed_size(cap)}] for cap={cap}")
    for name, t, size, dtype in (
        ("positions", positions, bs, torch.int64),
        ("out_slots", out_slots, bs, torch.int64),
        ("kv_indptr", kv_indptr, bs + 1, torch.int32),
    ):
        if t.numel() != size or t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} [{size}], got {t.dtype} [{t.numel()}]")
    if input_ids.dtype != torch.int64 or kv_indices.dtype != torch.int32 or table.dtype != torch.int32:
        raise ValueError("input_ids must be int64, kv_indices and table int32")
    if table.stride(1) != 1:
        raise ValueError("table rows must be contiguous")
    _step_fill_kernel[(bs,)](
        packed,
        last_tokens,
        table,
        input_ids,
        positions,
        out_slots,
        kv_indptr,
        kv_indices,
        table.stride(0),
        scratch,
        CAP=cap,
        BLOCK=block,
    )


def packed_size(cap: int) -> int:
    return 5 * cap + 2


def pack_decode_step(inp: StepInput, cap: int, out: np.ndarray) -> None:
    """Write decode step `inp` into `out` (int64 [packed_size(cap)]) in the packed layout."""
    n = inp.batch_size
    if not 1 <= n <= cap:
        raise ValueError(f"a decode step of {n} requests does not fit cap={cap}")
    out[0] = n
    for k, a in enumerate((inp.input_ids, inp.rows, inp.prefix_lens, inp.out_slots)):
        out[1 + k * cap : 1 + k * cap + n] = a
    indptr = out[1 + 4 * cap : 2 + 4 * cap + n]
    indptr[0] = 0
    np.cumsum(inp.prefix_lens + 1, out=indptr[1:])


class StepFillStaging:
    """The packed buffer on the device (`device_buf`, fixed: a graph reads its address), refilled
    each step through pinned host memory without stalling (`PinnedStaging`)."""

    def __init__(self, cap: int, device: torch.device) -> None:
        self.cap = cap
        self.device = device
        self._pinned = PinnedStaging(packed_size(cap), torch.int64, device)
        self.device_buf = self._pinned.device_buf

    @property
    def count(self) -> torch.Tensor:
        """The step's request count n on the device (a 0-d view: graphs read it at replay)."""
        return self.device_buf[0]

    @property
    def rows(self) -> torch.Tensor:
        """All `cap` row entries on the device; the step's rows are the first n."""
        return self.device_buf[1 + self.cap : 1 + 2 * self.cap]

    def upload(self, inp: StepInput) -> torch.Tensor:
        """Pack `inp` and queue its one copy into `device_buf` on the current stream."""
        return self._pinned.upload(lambda host: pack_decode_step(inp, self.cap, host))
