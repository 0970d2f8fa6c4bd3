"""`SlotAllocator`: the free list of KV slots.

One slot holds the K/V of one token (see `KVPool`). The allocator only knows
which slot ids are free; who owns the others (the radix tree or a running
request) is the caller's bookkeeping, checked by `RadixCache.check_integrity`.

The free list is a ring buffer of slot ids on the pool's device: `alloc(n)`
takes the n oldest free ids from the head, `free(slots)` appends at the tail.
So a fresh allocator hands out 0, 1, 2, … and a freed slot is reused only
after every slot that was already free (FIFO). That order is deterministic
(tests assert exact ids) and delays reuse, which makes a use-after-free in
the engine more likely to show up as wrong output than to hide. Both calls
are a slice/copy of at most two ranges: no Python loop over slots and no
device-to-host sync.
"""

from __future__ import annotations

import torch


class SlotAllocator:
    def __init__(self, num_slots: int, device: str | torch.device = "cpu", *, debug: bool = False) -> None:
        """`debug=True` validates every `free` (range, duplicates, double free); that costs a
        device-to-host sync per call, so it is for tests only."""
        if num_slots <= 0:
            raise ValueError(f"SlotAllocator needs at least one slot, got num_slots={num_slots}")
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.debug = debug
        # Free ids are ring[head], ring[head+1], … (mod num_slots), num_free of them.
        self._ring = torch.arange(num_slots, dtype=torch.int64, device=self.device)
        self._head = 0
        self._num_free = num_slots
        self._is_free = torch.ones(num_slots, dtype=torch.bool, device=self.device) if debug else None

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_slots - self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` free slots (int64, 1-D, on `device`), oldest free first.

        Returns None, and changes nothing, when fewer than `n` are free: never a
        partial allocation. Making room (evicting from the radix tree) is the
        caller's job; see `RadixCache.alloc`.
        """
        if n < 0:
            raise ValueError(f"alloc(n) needs n >= 0, got {n}")
        if n > self._num_free:
            return None
        start, end = self._head, self._head + n
        if end <= self.num_slots:
            out = self._ring[start:end].clone()
        else:  # the range wraps around the end of the ring
            out = torch.cat((self._ring[start:], self._ring[: end - self.num_slots]))
        self._head = end % self.num_slots
        self._num_free -= n
        if self._is_free is not None:
            self._is_free[out] = False
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Return `slots` (any integer dtype, any shape) to the tail of the free list.

        The caller must own every slot it frees and free it once. Without
        `debug` only the cheap check is made (more slots free than exist).
        """
        slots = slots.reshape(-1)
        n = slots.numel()
        if n == 0:
            return
        if self._num_free + n > self.num_slots:
            raise RuntimeError(
                f"freeing {n} slots with {self._num_free} of {self.num_slots} already free: double free"
            )
        if self._is_free is not None:
            self._check_free(slots)
        tail = (self._head + self._num_free) % self.num_slots
        first = min(n, self.num_slots - tail)
        self._ring[tail : tail + first].copy_(slots[:first])
        if first < n:
            self._ring[: n - first].copy_(slots[first:])
        self._num_free += n

    def free_slots(self) -> torch.Tensor:
        """A copy of the free ids in the order `alloc` will hand them out."""
        end = self._head + self._num_free
        if end <= self.num_slots:
            return self._ring[self._head : end].clone()
        return torch.cat((self._ring[self._head :], self._ring[: end - self.num_slots]))

    def reset(self) -> None:
        """Forget every allocation: all slots free again, in id order."""
        torch.arange(self.num_slots, out=self._ring)
        self._head = 0
        self._num_free = self.num_slots
        if self._is_free is not None:
            self._is_free.fill_(True)

    def _check_free(self, slots: torch.Tensor) -> None:
        assert self._is_free is not None
        if bool(((slots < 0) | (slots >= self.num_slots)).any()):
            raise RuntimeError(f"freeing slot ids outside [0, {self.num_slots})")
        slots = slots.to(device=self.device, dtype=torch.int64)
        if slots.unique().numel() != slots.numel():
            raise RuntimeError("freeing the same slot twice in one call")
        if bool(self._is_free[slots].any()):
            bad = slots[self._is_free[slots]][:8].tolist()
            raise RuntimeError(f"double free of slots {bad}")
        self._is_free[slots] = True

    def __repr__(self) -> str:
        return f"SlotAllocator(num_slots={self.num_slots}, num_free={self._num_free}, device={self.device})"
