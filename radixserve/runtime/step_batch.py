"""A step's `ForwardBatch`, made by the runner from its `StepInput` (runtime/step.py).

`build_forward_batch` picks the way: a step with host-listed `kv_indices` is
copied to the device as it is (`build_extend_batch`); a decode step, which
has none, is built on the device from the request-to-slot table
(`build_decode_batch`). Either way a request whose last input id is -1 takes
it from the runner's on-device buffer of last sampled tokens.

A decode step's host sends four numbers per request (row, prefix length, new slot, input
id) in one copy; everything that grows with the context (`kv_indices`, the
slots of every request's whole context) is gathered on the device from the
table, so host work per decode step does not depend on the context length.
No op here waits for the device: the one length the host needs (the total
context, the size of `kv_indices`) is summed from its own array.

On the CUDA device the gather is a few elementwise ops over the context
(`gather_context`); on the CPU, where the table is host memory, numpy copies
the row slices (`_gather_context_host`). Both give exactly the concatenation
of each request's table row (tests/runtime/test_step_batch.py checks both
against the host-built batch, and `gather_context` on the CPU too).
"""

from __future__ import annotations

import numpy as np
import torch

from radixserve.host_copy import to_device
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.step import StepInput


def gather_context(
    table: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor, kv_indptr: torch.Tensor, total: int
) -> torch.Tensor:
    """`cat([table[rows[i], :seq_lens[i]] for i])` as int32, without a loop or a sync.

    `total` is `seq_lens.sum()` (known on the host) and `kv_indptr` its exclusive prefix sum.
    """
    device = table.device
    owner = torch.repeat_interleave(torch.arange(len(rows), device=device), seq_lens, output_size=total)
    flat = (
        torch.arange(total, device=device) + (rows * table.shape[1] - kv_indptr[:-1].to(torch.int64))[owner]
    )
    return table.view(-1).index_select(0, flat)


def _gather_context_host(table: torch.Tensor, rows: np.ndarray, seq_lens: np.ndarray) -> torch.Tensor:
    """The same on the CPU, where the table is host memory: row slices copied by numpy
    (torch's CPU gather over every context slot is two orders of magnitude slower)."""
    t = table.numpy()
    return torch.from_numpy(np.concatenate([t[r, :n] for r, n in zip(rows.tolist(), seq_lens.tolist())]))


def build_forward_batch(
    step: StepInput, table: torch.Tensor | None, last_tokens: torch.Tensor, device: torch.device
) -> ForwardBatch:
    """The forward batch of `step`; `table` (`ReqToSlotTable.device_table`) is needed by decode steps."""
    if not step.is_decode:
        return build_extend_batch(step, last_tokens, device)
    if table is None:
        raise RuntimeError("a decode step needs the slot table (ReqToSlotTable.device_table)")
    return build_decode_batch(step, table, last_tokens, device)


@torch.inference_mode()
def build_extend_batch(step: StepInput, last_tokens: torch.Tensor, device: torch.device) -> ForwardBatch:
    """The forward batch of a step whose context slots the host listed (`kv_indices`)."""
    assert step.kv_indices is not None
    b = step.batch_size
    qo = np.zeros(b + 1, dtype=np.int32)
    np.cumsum(step.extend_lens, out=qo[1:])
    kv = np.zeros(b + 1, dtype=np.int32)
    np.cumsum(step.prefix_lens + step.extend_lens, out=kv[1:])
    positions = np.concatenate(
        [
            np.arange(p, p + e, dtype=np.int64)
            for p, e in zip(step.prefix_lens.tolist(), step.extend_lens.tolist())
        ]
    )
    ids = to_device(step.input_ids, torch.int64, device)
    last = qo[1:] - 1
    pending = np.flatnonzero(step.input_ids[last] < 0)
    if len(pending):  # ids the previous step is still sampling: take them from the device
        if ids.device.type == "cpu":
            ids = ids.clone()  # a CPU tensor shares the step's array, which stays as it was
        ids[to_device(last[pending], torch.int64, device)] = last_tokens[
            to_device(step.rows[pending], torch.int64, device)
        ]
    return ForwardBatch(
        input_ids=ids,
        positions=to_device(positions, torch.int64, device),
        out_slots=to_device(step.out_slots, torch.int64, device),
        qo_indptr=to_device(qo, torch.int32, device),
        kv_indptr=to_device(kv, torch.int32, device),
        kv_indices=to_device(step.kv_indices, torch.int32, device),
        extend_lens=step.extend_lens.tolist(),
        prefix_lens=step.prefix_lens.tolist(),
        logit_rows=None if step.logit_rows is None else to_device(step.logit_rows, torch.int64, device),
        cascade=step.cascade,
    )


@torch.inference_mode()
def build_decode_batch(
    inp: StepInput, table: torch.Tensor, last_tokens: torch.Tensor, device: torch.device
) -> ForwardBatch:
    """The forward batch of a decode step; also records each new slot in `table`.

    `table` is the device copy of the request-to-slot table (`ReqToSlotTable.device_table`),
    `last_tokens` the runner's per-row buffer of last sampled ids.
    """
    b = inp.batch_size
    packed = np.stack((inp.input_ids, inp.rows, inp.prefix_lens, inp.out_slots))
    ids, rows, pos, out_slots = to_device(packed, torch.int64, device).unbind(0)
    # A -1 is a token the previous step is still sampling: take it from the device.
    ids = torch.where(ids < 0, last_tokens[rows], ids)
    table[rows, pos] = out_slots.to(torch.int32)
    seq_lens = pos + 1
    kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    total = int(inp.prefix_lens.sum()) + b
    prefix_lens = inp.prefix_lens.tolist()
    if table.device.type == "cpu":
        kv_indices = _gather_context_host(table, inp.rows, inp.prefix_lens + 1)
    else:
        kv_indices = gather_context(table, rows, seq_lens, kv_indptr, total)
    return ForwardBatch(
        input_ids=ids,
        positions=pos,
        out_slots=out_slots,
        qo_indptr=torch.arange(b + 1, dtype=torch.int32, device=device),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        extend_lens=[1] * b,
        prefix_lens=prefix_lens,
        cascade=inp.cascade,
        rows=rows,
    )
