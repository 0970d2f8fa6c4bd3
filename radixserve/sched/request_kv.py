"""`RequestKV`: which KV slots each running request owns, and handing them to the tree.

The radix tree's lock protocol (cache/radix_tree.py), applied to requests:

- `claim` locks the request's cached prefix *before* allocating (allocation
  may evict), then gives it a table row holding the prefix's slots followed by
  its first new ones. `req.own_from` marks where its own slots begin.
- `cache_prefix` (after a prefill chunk) and `release` (at the end) insert the
  request's tokens into the tree, free the slots the tree already had copies
  of, and move the lock to the new path (or drop it).

The scheduler decides who runs; this class only keeps the books, so that
every slot is free, in the tree, or owned by exactly one running request.
"""

from __future__ import annotations

import numpy as np
import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.cache.tree_node import MatchResult
from radixserve.sched.request import Request


class RequestKV:
    def __init__(self, allocator: SlotAllocator, cache: RadixCache | None, table: ReqToSlotTable) -> None:
        self.allocator = allocator
        self.cache = cache
        self.table = table
        self.slots = table.table.numpy()  # host view of the table: cheap slicing per step

    def available(self) -> int:
        """Slots an allocation could get: free ones plus what eviction could free."""
        return self.allocator.num_free + (self.cache.evictable_size if self.cache else 0)

    def alloc(self, n: int) -> torch.Tensor | None:
        return self.cache.alloc(n) if self.cache else self.allocator.alloc(n)

    def claim(self, req: Request, match: MatchResult | None, n: int, reserve: int) -> bool:
        """Lock `match` (the cached prefix; None only without a cache), take a row and `n`
        new slots, keeping `reserve` more available; on failure nothing changes."""
        cached = match.length if match else 0
        if self.cache is not None:
            assert match is not None
            self.cache.lock(match.last_node)
        row = self.table.alloc_row() if n + reserve <= self.available() else None
        slots = self.alloc(n) if row is not None else None
        if slots is None:
            if row is not None:
                self.table.free_row(row)
            if self.cache is not None and match is not None:
                self.cache.unlock(match.last_node)
            return False
        assert row is not None
        if match is not None and cached:
            self.table.write(row, 0, match.slots)
        self.table.write(row, cached, slots)
        req.row, req.kv_len, req.own_from = row, cached, cached
        req.lock_node = match.last_node if match else None
        return True

    def grow(self, req: Request, n: int) -> bool:
        """The next `n` slots of a running request (a prefill chunk)."""
        slots = self.alloc(n) if 0 < n <= self.available() else None
        if slots is None:
            return False
        self.table.write(req.row, req.kv_len, slots)
        return True

    def put_decode_slots(self, reqs: list[Request], slots: np.ndarray) -> None:
        """One new slot per request (its next token) in a step built on the host (a mixed
        step): into both copies of the table, since later decode steps read the device one."""
        self.table.scatter(
            np.fromiter((r.row for r in reqs), np.int64, len(reqs)),
            np.fromiter((r.kv_len for r in reqs), np.int64, len(reqs)),
            slots,
        )

    def _own(self, req: Request) -> torch.Tensor:
        return torch.from_numpy(self.slots[req.row, : req.kv_len].astype(np.int64))

    def _insert(self, req: Request, key: list[int], slots: torch.Tensor) -> None:
        """Insert `key`; free this request's copies of what the tree already held."""
        assert self.cache is not None
        cached = self.cache.insert(key, slots[: len(key)], req.extra_key)
        if cached > req.own_from:
            self.allocator.free(slots[req.own_from : cached])

    def cache_prefix(self, req: Request) -> None:
        """Put a prefilled prefix (a chunk or the whole prompt) into the tree and hold it locked."""
        assert self.cache is not None
        key = req.known_ids(0, min(req.kv_len, req.num_known))
        self._insert(req, key, self._own(req))
        match = self.cache.match_prefix(key, req.extra_key)
        self.cache.lock(match.last_node)
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
        req.lock_node = match.last_node
        self.table.write(req.row, 0, match.slots)
        req.own_from = match.length

    def release(self, req: Request) -> None:
        """Give a request's KV to the tree (or the allocator) and its row back."""
        if req.row < 0:
            return
        slots = self._own(req)
        if self.cache is not None:
            valid = min(req.kv_len, req.num_known)  # KV of ids we know
            self._insert(req, req.all_ids[:valid], slots)
            kept = max(self.cache.page_aligned(valid), req.own_from)
            if req.kv_len > kept:  # a partial page, or a slot of a step still in flight
                self.allocator.free(slots[kept:])
            if req.lock_node is not None:
                self.cache.unlock(req.lock_node)
        elif req.kv_len:
            self.allocator.free(slots)
        self.table.free_row(req.row)
        req.row, req.kv_len, req.own_from, req.lock_node = -1, 0, 0, None

    def live_slots(self, running: list[Request]) -> list[torch.Tensor]:
        """Slots owned by running requests and not (yet) by the tree."""
        return [torch.from_numpy(self.slots[r.row, r.own_from : r.kv_len].astype(np.int64)) for r in running]

    def check_integrity(self, running: list[Request]) -> None:
        if self.cache is not None:
            self.cache.check_integrity(self.live_slots(running))
        else:
            used = sum(r.kv_len for r in running)
            assert self.allocator.num_free + used == self.allocator.num_slots, "KV slots leaked"
