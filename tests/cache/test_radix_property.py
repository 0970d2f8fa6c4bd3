"""Random sequences of cache operations against a reference model (hypothesis, stateful).

The reference is a dict from (extra_key, token prefix) to the slot holding
the prefix's last token: the tree must hold exactly that, prefix-closed and
in whole pages. Running requests follow the caller protocol of
`radixserve.cache.radix_tree`; eviction is observed through the allocator
(which slots came back) and must only remove unlocked suffixes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixserve.cache import RadixCache, SlotAllocator, TreeNode

NUM_SLOTS = 40
# Keys share prefixes the way prompts do: a prefix of one of a few "documents" (which diverge
# from each other at different offsets, inside and at page boundaries), plus a short tail.
DOCUMENTS = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
    (0, 1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 9),
    (0, 1, 2, 3, 4, 5, 6, 7, 1, 1, 1, 1),
    (0, 1, 7, 7, 7, 7, 7, 7),
    (5, 5, 5, 5, 5, 5),
)
KEYS = st.builds(
    lambda doc, n, tail: list(DOCUMENTS[doc][:n]) + tail,
    st.integers(0, len(DOCUMENTS) - 1),
    st.integers(0, 12),
    st.lists(st.integers(0, 11), max_size=3),
)
NAMESPACES = st.sampled_from([None, "a"])
RefKey = tuple[str | None, tuple[int, ...]]


class RecordingAllocator(SlotAllocator):
    def __init__(self, num_slots: int) -> None:
        super().__init__(num_slots, debug=True)
        self.freed: list[int] = []

    def free(self, slots: torch.Tensor) -> None:
        self.freed.extend(slots.reshape(-1).tolist())
        super().free(slots)

    def take_freed(self) -> list[int]:
        out, self.freed = self.freed, []
        return out


@dataclass
class Running:
    key: list[int]
    ns: str | None
    node: TreeNode  # locked
    matched: int  # slots[:matched] are the tree's
    slots: torch.Tensor  # one per token of key
    own: torch.Tensor  # slots[matched:], the request's


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = RecordingAllocator(NUM_SLOTS)
        self.cache = RadixCache(self.alloc)
        self.ref: dict[RefKey, tuple[int, ...]] = {}  # page prefix -> the last page's slots
        self.running: list[Running] = []
        self.held: list[torch.Tensor] = []  # raw allocations owned by "someone else"

    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.cache = RadixCache(self.alloc, page_size=page_size)

    # ---- reference model ------------------------------------------------------------------
    # Keyed by page: with page_size > 1 two keys that differ inside their first page share
    # nothing, not even the tokens before the difference.

    def page_key(self, ns: str | None, key: list[int], pages: int) -> RefKey:
        return (ns, tuple(key[: pages * self.cache.page_size]))

    def expected_slots(self, key: list[int], ns: str | None) -> list[int]:
        ps = self.cache.page_size
        out: list[int] = []
        for p in range(len(key) // ps):
            page = self.ref.get(self.page_key(ns, key, p + 1))
            if page is None:
                break
            out.extend(page)
        return out

    def remember(self, key: list[int], ns: str | None, slots: torch.Tensor, start: int) -> None:
        ps = self.cache.page_size
        for p in range(start // ps, len(key) // ps):
            self.ref[self.page_key(ns, key, p + 1)] = tuple(slots[p * ps : (p + 1) * ps].tolist())

    def forget_evicted(self, freed: list[int]) -> None:
        """Drop what eviction freed from the reference; it must have been whole unlocked suffixes."""
        by_slot = {slot: k for k, page in self.ref.items() for slot in page}
        gone = set()
        for slot in freed:
            assert slot in by_slot, f"eviction freed slot {slot}, which the tree did not hold"
            gone.add(by_slot[slot])
        assert sorted(freed) == sorted(s for k in gone for s in self.ref[k]), "eviction split a page"
        for k in gone:
            del self.ref[k]
        ps = self.cache.page_size
        for ns, prefix in self.ref:
            assert len(prefix) == ps or (ns, prefix[:-ps]) in self.ref, "eviction left a hole in a prefix"

    def locked_pages(self) -> set[RefKey]:
        ps = self.cache.page_size
        return {self.page_key(r.ns, r.key, p + 1) for r in self.running for p in range(r.matched // ps)}

    def check_match(self, key: list[int], ns: str | None) -> None:
        m = self.cache.match_prefix(key, ns)
        assert m.slots.tolist() == self.expected_slots(key, ns)
        assert m.length % self.cache.page_size == 0

    # ---- rules ----------------------------------------------------------------------------

    @rule(key=KEYS, ns=NAMESPACES)
    def match(self, key: list[int], ns: str | None) -> None:
        self.check_match(key, ns)

    @rule(key=KEYS, ns=NAMESPACES)
    def start_request(self, key: list[int], ns: str | None) -> None:
        expected = self.expected_slots(key, ns)
        m = self.cache.match_prefix(key, ns)
        assert m.slots.tolist() == expected
        self.cache.lock(m.last_node)
        need = len(key) - m.length
        room = self.alloc.num_free + self.cache.evictable_size
        self.alloc.take_freed()
        own = self.cache.alloc(need)
        self.forget_evicted(self.alloc.take_freed())
        if own is None:
            assert need > room
            self.cache.unlock(m.last_node)
            return
        slots = torch.cat([m.slots, own])
        self.running.append(Running(key, ns, m.last_node, m.length, slots, own))

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 1000))
    def finish_request(self, pick: int) -> None:
        req = self.running.pop(pick % len(self.running))
        expected = len(self.expected_slots(req.key, req.ns))
        cached = self.cache.insert(req.key, req.slots, req.ns)
        assert cached == expected and cached >= req.matched
        self.alloc.free(req.slots[req.matched : cached])
        self.alloc.free(req.slots[self.cache.page_aligned(len(req.key)) :])
        self.cache.unlock(req.node)
        self.remember(req.key, req.ns, req.slots, cached)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 1000))
    def abort_request(self, pick: int) -> None:
        req = self.running.pop(pick % len(self.running))
        self.alloc.free(req.own)
        self.cache.unlock(req.node)

    @rule(key=KEYS, ns=NAMESPACES)
    def insert_fresh(self, key: list[int], ns: str | None) -> None:
        self.alloc.take_freed()
        slots = self.cache.alloc(len(key))
        self.forget_evicted(self.alloc.take_freed())
        if slots is None:
            return
        expected = len(self.expected_slots(key, ns))
        cached = self.cache.insert(key, slots, ns)
        assert cached == expected
        self.alloc.free(slots[:cached])
        self.alloc.free(slots[self.cache.page_aligned(len(key)) :])
        self.remember(key, ns, slots, cached)

    @rule(n=st.integers(0, 8))
    def evict(self, n: int) -> None:
        before = self.cache.evictable_size
        self.alloc.take_freed()
        freed = self.cache.evict(n)
        evicted = self.alloc.take_freed()
        assert freed == len(evicted) and self.cache.evictable_size == before - freed
        assert freed >= n or self.cache.evictable_size == 0
        self.forget_evicted(evicted)

    @rule(n=st.integers(1, 8))
    def raw_alloc(self, n: int) -> None:
        free = self.alloc.num_free
        got = self.alloc.alloc(n)
        assert (got is None) == (n > free)
        if got is not None:
            self.held.append(got)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 1000))
    def raw_free(self, pick: int) -> None:
        self.alloc.free(self.held.pop(pick % len(self.held)))

    @precondition(lambda self: not self.running and self.cache.total_size > NUM_SLOTS // 2)
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.ref.clear()
        assert self.cache.total_size == 0
        assert self.alloc.num_free == NUM_SLOTS - sum(h.numel() for h in self.held)

    # ---- checked after every step ---------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        live = [r.own for r in self.running] + self.held
        self.cache.check_integrity(live_slots=live)
        ps = self.cache.page_size
        assert self.cache.total_size == ps * len(self.ref)
        assert self.cache.protected_size == ps * len(self.locked_pages())
        for r in self.running:  # locked prefixes survived every eviction, with the same slots
            for p in range(r.matched // ps):
                page = tuple(r.slots[p * ps : (p + 1) * ps].tolist())
                assert self.ref[self.page_key(r.ns, r.key, p + 1)] == page

    def teardown(self) -> None:
        # every request ends and the cache is flushed: the allocator is full again
        for r in self.running:
            self.alloc.free(r.own)
            self.cache.unlock(r.node)
        for h in self.held:
            self.alloc.free(h)
        self.cache.reset()
        assert self.alloc.num_free == NUM_SLOTS


RadixMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=80,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixMachine = RadixMachine.TestCase
