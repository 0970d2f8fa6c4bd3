"""`ReqToSlotTable`: for each running request, the KV slot of each position.

Row r of `table` belongs to one running request; `table[r, p]` is the slot
holding the K/V of its token at position p, for every position it has
computed (or got from the radix cache). The scheduler writes a row as slots
are matched or allocated. Stored as int32 (half the memory of int64;
FlashInfer wants int32 indices); `read` returns int64, the dtype the
allocator and the radix tree use.

Two copies: `table` on the host, which the scheduler reads (prefill steps,
handing KV to the radix tree), and `device_table` where the model runs, from
which the runner gathers a decode step's `kv_indices` without the host
touching the context (runtime/step_batch.py). On the CPU they are one
tensor. `write` updates both (the device copy queued on the current stream);
a decode step's one new slot per request is scattered into the host copy by
the scheduler and into the device copy by the runner.

Rows are handed out 0, 1, 2, … and a freed row is reused after every row that
was already free (FIFO, like the slot allocator). The table never owns
slots: freeing a row does not free its slots, that is the caller's job.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from radixserve.host_copy import to_device


class ReqToSlotTable:
    def __init__(self, max_requests: int, max_context: int, device: str | torch.device = "cpu") -> None:
        if max_requests <= 0 or max_context <= 0:
            raise ValueError(
                f"ReqToSlotTable needs max_requests > 0 and max_context > 0, "
                f"got max_requests={max_requests}, max_context={max_context}"
            )
        self.max_requests = max_requests
        self.max_context = max_context
        self.device = torch.device(device)
        self.table = torch.zeros((max_requests, max_context), dtype=torch.int32)
        self.device_table = (
            self.table
            if self.device.type == "cpu"
            else torch.zeros((max_requests, max_context), dtype=torch.int32, device=self.device)
        )
        self._free_rows: deque[int] = deque(range(max_requests))
        self._in_use = [False] * max_requests

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        """A free row, or None when every row is taken."""
        if not self._free_rows:
            return None
        row = self._free_rows.popleft()
        self._in_use[row] = True
        return row

    def free_row(self, row: int) -> None:
        self._check_row(row)
        self._in_use[row] = False
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Positions `start : start + len(slots)` of `row` now live in `slots`."""
        self._check_row(row)
        end = start + slots.numel()
        if start < 0 or end > self.max_context:
            raise ValueError(
                f"positions [{start}, {end}) outside the table's context [0, {self.max_context})"
            )
        flat = slots.reshape(-1)
        self.table[row, start:end].copy_(flat)
        if self.device_table is not self.table and end > start:
            # Staged through pinned memory: from pageable memory the copy would wait for the stream.
            src = flat.to("cpu", torch.int32).pin_memory()
            self.device_table[row, start:end].copy_(src, non_blocking=True)

    def scatter(self, rows: np.ndarray, cols: np.ndarray, slots: np.ndarray) -> None:
        """`table[rows[i], cols[i]] = slots[i]` in both copies (one scatter each)."""
        self.table.numpy()[rows, cols] = slots
        if self.device_table is not self.table and len(rows):
            n = len(rows)
            # One copy through pinned memory from torch's caching host allocator, which hands
            # out a block only once the copies that read it have run: the host never waits.
            d = to_device(np.concatenate((rows, cols, slots)), torch.int64, self.device_table.device)
            self.device_table[d[:n], d[n : 2 * n]] = d[2 * n :].to(torch.int32)

    def read(self, row: int, end: int) -> torch.Tensor:
        """The slots of positions `0 : end` of `row`, as a new int64 tensor."""
        self._check_row(row)
        if end < 0 or end > self.max_context:
            raise ValueError(f"end={end} outside the table's context [0, {self.max_context}]")
        return self.table[row, :end].to(torch.int64)

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.max_requests or not self._in_use[row]:
            raise ValueError(f"row {row} is not an allocated row of this table")
