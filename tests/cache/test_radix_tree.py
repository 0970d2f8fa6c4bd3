"""RadixCache with exact expectations: slot ids, split points, eviction order, locks, pages, namespaces."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from radixserve.cache import RadixCache, ReqToSlotTable, SlotAllocator, TreeNode


class RecordingAllocator(SlotAllocator):
    """Remembers every freed slot id in order, so tests can assert what eviction freed."""

    def __init__(self, num_slots: int) -> None:
        super().__init__(num_slots, debug=True)
        self.freed: list[int] = []

    def free(self, slots: torch.Tensor) -> None:
        self.freed.extend(slots.reshape(-1).tolist())
        super().free(slots)

    def take_freed(self) -> list[int]:
        out, self.freed = self.freed, []
        return out


def make(num_slots: int = 64, page_size: int = 1) -> tuple[RecordingAllocator, RadixCache]:
    alloc = RecordingAllocator(num_slots)
    return alloc, RadixCache(alloc, page_size=page_size)


def ids(t: torch.Tensor) -> list[int]:
    return t.tolist()


def put(alloc: SlotAllocator, cache: RadixCache, tokens: Sequence[int], extra_key: str | None = None) -> int:
    """A request with no cache hit computes `tokens` into fresh slots, then caches them by the protocol."""
    slots = alloc.alloc(len(tokens))
    assert slots is not None
    cached = cache.insert(tokens, slots, extra_key)
    alloc.free(slots[:cached])  # duplicates of what was cached already
    alloc.free(slots[cache.page_aligned(len(tokens)) :])  # partial page
    return cached


def only_child(node: TreeNode) -> TreeNode:
    (child,) = node.children.values()
    return child


def test_empty_tree_matches_nothing() -> None:
    _, cache = make()
    m = cache.match_prefix([1, 2, 3])
    assert m.length == 0 and m.slots.dtype == torch.int64 and ids(m.slots) == []
    assert m.last_node is cache.root
    assert cache.total_size == 0 and cache.num_nodes == 0
    cache.check_integrity()


def test_match_mid_edge_splits_node() -> None:
    alloc, cache = make()
    slots = alloc.alloc(5)
    assert slots is not None and ids(slots) == [0, 1, 2, 3, 4]
    assert cache.insert([1, 2, 3, 4, 5], slots) == 0
    assert cache.num_nodes == 1

    m = cache.match_prefix([1, 2, 3, 9, 9])
    assert ids(m.slots) == [0, 1, 2] and m.length == 3
    assert m.last_node.key == (1, 2, 3) and ids(m.last_node.slots) == [0, 1, 2]
    lower = only_child(m.last_node)
    assert lower.key == (4, 5) and ids(lower.slots) == [3, 4]
    assert cache.num_nodes == 2 and cache.total_size == 5

    full = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert ids(full.slots) == [0, 1, 2, 3, 4]
    assert full.last_node is lower  # the original node object is the lower half

    # a key that ends inside an edge splits there too, so last_node ends exactly at the match
    short = cache.match_prefix([1, 2])
    assert ids(short.slots) == [0, 1] and short.last_node.key == (1, 2)
    assert only_child(short.last_node) is m.last_node and m.last_node.key == (3,)
    assert cache.num_nodes == 3
    cache.check_integrity()


def test_match_accepts_tensors_and_tuples() -> None:
    alloc, cache = make()
    put(alloc, cache, [5, 6, 7])
    assert ids(cache.match_prefix(torch.tensor([5, 6, 7, 8])).slots) == [0, 1, 2]
    assert ids(cache.match_prefix((5, 6)).slots) == [0, 1]


def test_insert_returns_cached_length_and_takes_only_new_slots() -> None:
    alloc, cache = make()
    first = alloc.alloc(5)
    assert first is not None
    assert cache.insert([1, 2, 3, 4, 5], first) == 0

    second = alloc.alloc(5)
    assert second is not None and ids(second) == [5, 6, 7, 8, 9]
    assert cache.insert([1, 2, 3, 6, 7], second) == 3
    alloc.free(second[:3])  # the caller's duplicates of [1, 2, 3]
    assert ids(cache.match_prefix([1, 2, 3, 6, 7]).slots) == [0, 1, 2, 8, 9]
    assert ids(cache.match_prefix([1, 2, 3, 4, 5]).slots) == [0, 1, 2, 3, 4]
    assert cache.total_size == 7 and cache.evictable_size == 7
    cache.check_integrity()

    # fully cached: nothing taken, all the caller's slots are duplicates
    third = alloc.alloc(3)
    assert third is not None
    assert cache.insert([1, 2, 3], third) == 3
    alloc.free(third)
    assert cache.total_size == 7
    cache.check_integrity()


def test_insert_copies_slots() -> None:
    alloc, cache = make()
    slots = alloc.alloc(3)
    assert slots is not None
    cache.insert([1, 2, 3], slots)
    slots[0] = 42  # the caller reuses its tensor
    assert ids(cache.match_prefix([1, 2, 3]).slots) == [0, 1, 2]


def test_insert_rejects_slot_count_mismatch() -> None:
    alloc, cache = make()
    slots = alloc.alloc(2)
    assert slots is not None
    with pytest.raises(ValueError, match="one slot per token"):
        cache.insert([1, 2, 3], slots)


def test_request_protocol_duplicate_freed_by_second() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])  # slots 0..2
    ma = cache.match_prefix([1, 2, 3, 4, 5])
    cache.lock(ma.last_node)
    own_a = cache.alloc(2)
    mb = cache.match_prefix([1, 2, 3, 4, 5])
    cache.lock(mb.last_node)
    own_b = cache.alloc(2)
    assert own_a is not None and own_b is not None
    assert ids(own_a) == [3, 4] and ids(own_b) == [5, 6]
    assert cache.protected_size == 3 and ma.last_node is mb.last_node and ma.last_node.lock_ref == 2

    # A finishes: [1, 2, 3] was cached (its match), [4, 5] is new and now the tree's
    cached_a = cache.insert([1, 2, 3, 4, 5], torch.cat([ma.slots, own_a]))
    assert cached_a == 3
    alloc.free(own_a[: cached_a - ma.length])  # nothing
    cache.unlock(ma.last_node)
    cache.check_integrity(live_slots=[own_b])

    # B finishes: [4, 5] is cached by now; its own copies are duplicates
    cached_b = cache.insert([1, 2, 3, 4, 5], torch.cat([mb.slots, own_b]))
    assert cached_b == 5
    slots_b = torch.cat([mb.slots, own_b])
    assert ids(slots_b[mb.length : cached_b]) == [5, 6]
    alloc.free(slots_b[mb.length : cached_b])
    cache.unlock(mb.last_node)
    assert ids(cache.match_prefix([1, 2, 3, 4, 5]).slots) == [0, 1, 2, 3, 4]
    assert cache.protected_size == 0
    cache.check_integrity()


def test_chunked_request_caches_then_relocks() -> None:
    """Protocol step 3: a running request caches its first chunk and swaps its lock."""
    alloc, cache = make(page_size=2)
    table = ReqToSlotTable(max_requests=2, max_context=16)
    put(alloc, cache, [1, 2, 3, 4])  # slots 0..3
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    m = cache.match_prefix(prompt[:-1])
    cache.lock(m.last_node)
    row = table.alloc_row()
    assert row is not None and ids(m.slots) == [0, 1, 2, 3]
    table.write(row, 0, m.slots)
    own = cache.alloc(3)  # chunk 1 computes positions 4..6
    assert own is not None and ids(own) == [4, 5, 6]
    table.write(row, 4, own)

    assert put(alloc, cache, [1, 2, 3, 4, 5, 6]) == 4  # meanwhile: the tree gets (5,6) in slots 11, 12
    slots = table.read(row, 7)
    cached = cache.insert(prompt[:7], slots)
    assert cached == 6  # (1,2) (3,4) (5,6); the partial page (7,) stays the request's
    alloc.free(slots[m.length : cached])  # its copies of (5,6): slots 4, 5
    m2 = cache.match_prefix(prompt[:7])
    assert m2.length == 6 and ids(m2.slots) == [0, 1, 2, 3, 11, 12]
    cache.lock(m2.last_node)
    cache.unlock(m.last_node)
    table.write(row, 0, m2.slots)
    assert ids(table.read(row, 7)) == [0, 1, 2, 3, 11, 12, 6]
    assert cache.protected_size == 6
    cache.check_integrity(live_slots=[table.read(row, 7)[m2.length :]])

    own2 = cache.alloc(1)  # chunk 2: position 7
    assert own2 is not None
    table.write(row, 7, own2)
    slots = table.read(row, 8)
    assert cache.insert(prompt[:8], slots) == m2.length  # no duplicates this time
    cache.unlock(m2.last_node)
    table.free_row(row)
    assert ids(cache.match_prefix(prompt).slots) == [0, 1, 2, 3, 11, 12, 6, *ids(own2)]
    assert cache.protected_size == 0
    cache.check_integrity()


def test_eviction_is_lru_over_leaves() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 1])  # slots 0, 1
    put(alloc, cache, [2, 2])  # slots 2, 3
    put(alloc, cache, [3, 3])  # slots 4, 5
    cache.match_prefix([2, 2])  # B is now the most recent
    alloc.take_freed()

    assert cache.evict(1) == 2  # whole leaves: asked 1, freed 2
    assert alloc.take_freed() == [0, 1]
    assert cache.evict(3) == 4
    assert alloc.take_freed() == [4, 5, 2, 3]
    assert cache.evict(1) == 0 and alloc.take_freed() == []
    assert cache.total_size == 0 and alloc.num_free == 64
    cache.check_integrity()


def test_evict_zero_frees_nothing() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2])
    alloc.take_freed()
    assert cache.evict(0) == 0 and alloc.take_freed() == []
    assert cache.total_size == 2


def test_parent_that_becomes_a_leaf_joins_eviction() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])  # slots 0..3
    assert put(alloc, cache, [1, 2, 5, 6]) == 2  # slots 4..7; 4, 5 were duplicates
    put(alloc, cache, [9, 9])  # slots 8, 9
    # tree: (1,2)[0,1] -> {(3,4)[2,3], (5,6)[6,7]};  (9,9)[8,9] accessed last
    alloc.take_freed()
    assert cache.evict(5) == 6
    # both children, then their parent (last touched before (9,9) was inserted)
    assert alloc.take_freed() == [2, 3, 6, 7, 0, 1]
    assert ids(cache.match_prefix([9, 9]).slots) == [8, 9]
    assert cache.match_prefix([1, 2]).length == 0
    cache.check_integrity()


def test_recently_matched_parent_outlives_older_leaf() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])  # slots 0..3
    put(alloc, cache, [1, 2, 5, 6])  # tree keeps 6, 7
    put(alloc, cache, [9, 9])  # slots 8, 9
    assert ids(cache.match_prefix([1, 2]).slots) == [0, 1]  # touches only the parent
    alloc.take_freed()
    assert cache.evict(100) == 8
    assert alloc.take_freed() == [2, 3, 6, 7, 8, 9, 0, 1]
    cache.check_integrity()


def test_locked_path_survives_eviction() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])  # slots 0..3
    put(alloc, cache, [5, 6])  # slots 4, 5
    m = cache.match_prefix([1, 2])  # splits (1,2,3,4)
    cache.lock(m.last_node)
    assert (cache.protected_size, cache.evictable_size) == (2, 4)
    alloc.take_freed()

    assert cache.evict(100) == 4
    assert alloc.take_freed() == [2, 3, 4, 5]
    assert ids(cache.match_prefix([1, 2, 3, 4]).slots) == [0, 1]
    assert cache.evict(100) == 0  # only locked nodes left
    assert (cache.protected_size, cache.evictable_size) == (2, 0)
    cache.check_integrity()

    cache.unlock(m.last_node)
    assert (cache.protected_size, cache.evictable_size) == (0, 2)
    assert cache.evict(1) == 2 and alloc.take_freed() == [0, 1]
    assert alloc.num_free == alloc.num_slots
    cache.check_integrity()


def test_lock_counts_along_the_path() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])
    put(alloc, cache, [1, 2, 5])
    top = cache.match_prefix([1, 2]).last_node
    deep = cache.match_prefix([1, 2, 3, 4]).last_node
    side = cache.match_prefix([1, 2, 5]).last_node
    assert deep.parent is top and side.parent is top

    cache.lock(deep)
    cache.lock(deep)
    cache.lock(side)
    assert (top.lock_ref, deep.lock_ref, side.lock_ref) == (3, 2, 1)
    assert (cache.protected_size, cache.evictable_size) == (5, 0)
    cache.check_integrity()
    cache.unlock(deep)
    cache.unlock(deep)
    assert (top.lock_ref, deep.lock_ref) == (1, 0)
    assert (cache.protected_size, cache.evictable_size) == (3, 2)
    with pytest.raises(RuntimeError, match="not locked"):
        cache.unlock(deep)
    cache.unlock(side)
    assert cache.protected_size == 0 and top.lock_ref == 0
    cache.lock(cache.root)  # an empty match: no-op
    cache.unlock(cache.root)
    cache.check_integrity()


def test_lock_of_an_evicted_node_fails() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2])
    m = cache.match_prefix([1, 2])
    assert cache.evict(2) == 2
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(m.last_node)


def test_alloc_evicts_only_what_it_needs() -> None:
    alloc, cache = make(num_slots=8)
    put(alloc, cache, [1, 2, 3, 4])  # slots 0..3
    put(alloc, cache, [5, 6, 7])  # slots 4..6
    assert alloc.num_free == 1
    alloc.take_freed()
    got = cache.alloc(3)
    assert got is not None and ids(got) == [7, 0, 1]  # free list after evicting (1,2,3,4): 7, 0, 1, 2, 3
    assert alloc.take_freed() == [0, 1, 2, 3]
    assert cache.total_size == 3

    assert cache.alloc(20) is None  # impossible: nothing evicted in vain
    assert cache.total_size == 3 and alloc.take_freed() == []
    cache.check_integrity(live_slots=[got])


def test_pages_truncate_matches_and_inserts() -> None:
    alloc, cache = make(page_size=4)
    assert [cache.page_aligned(n) for n in (0, 3, 4, 10)] == [0, 0, 4, 8]
    key = list(range(100, 110))
    slots = alloc.alloc(10)
    assert slots is not None
    assert cache.insert(key, slots) == 0
    assert cache.total_size == 8
    alloc.free(slots[8:])  # the partial page stays the caller's
    cache.check_integrity()

    m = cache.match_prefix([*key[:6], 999, 999])  # diverges inside the second page
    assert ids(m.slots) == [0, 1, 2, 3] and m.last_node.key == (100, 101, 102, 103)
    assert cache.num_nodes == 2  # split at the page boundary, not at the divergence
    assert ids(cache.match_prefix(key[:7]).slots) == [0, 1, 2, 3]  # 7 tokens: one whole page
    assert cache.num_nodes == 2
    assert ids(cache.match_prefix(key).slots) == list(range(8))

    # diverging inside a page: a sibling page that starts with the same token
    other = [*key[:5], 50, 51, 52, 53]
    slots2 = alloc.alloc(9)
    assert slots2 is not None and ids(slots2) == list(range(10, 19))
    assert cache.insert(other, slots2) == 4
    alloc.free(slots2[:4])
    alloc.free(slots2[8:])
    assert ids(cache.match_prefix(other).slots) == [0, 1, 2, 3, 14, 15, 16, 17]
    assert len(m.last_node.children) == 2
    assert cache.match_prefix(key[:3]).length == 0
    cache.check_integrity()


def test_page_size_protocol_frees_everything() -> None:
    alloc, cache = make(num_slots=32, page_size=4)
    for tokens in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7], [1, 2, 3], [8] * 9):
        put(alloc, cache, tokens)
        cache.check_integrity()
    assert cache.total_size == 4 + 8
    cache.evict(cache.evictable_size)
    assert alloc.num_free == 32
    cache.check_integrity()


def test_namespaces_never_share() -> None:
    alloc, cache = make()
    assert put(alloc, cache, [1, 2, 3]) == 0  # slots 0..2
    assert put(alloc, cache, [1, 2, 3], extra_key="lora-a") == 0  # slots 3..5
    assert put(alloc, cache, [1, 2, 3, 4], extra_key="lora-a") == 3  # slot 9 (6..8 were duplicates)
    assert ids(cache.match_prefix([1, 2, 3]).slots) == [0, 1, 2]
    assert ids(cache.match_prefix([1, 2, 3, 4], extra_key="lora-a").slots) == [3, 4, 5, 9]
    miss = cache.match_prefix([1, 2, 3], extra_key="lora-b")
    assert miss.length == 0 and miss.last_node is cache.root
    assert cache.total_size == 7
    cache.check_integrity()

    alloc.take_freed()
    assert cache.evict(3) == 3  # the oldest leaf: the default namespace's (1,2,3)
    assert alloc.take_freed() == [0, 1, 2]
    assert cache.match_prefix([1, 2, 3], extra_key="lora-a").length == 3
    cache.check_integrity()


def test_reset_frees_everything_and_requires_no_locks() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 4], extra_key="x")
    m = cache.match_prefix([1, 2])
    cache.lock(m.last_node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.unlock(m.last_node)
    cache.reset()
    assert alloc.num_free == alloc.num_slots
    assert (cache.total_size, cache.num_nodes, cache.evictable_size) == (0, 0, 0)
    assert cache.match_prefix([1, 2, 3]).length == 0
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(m.last_node)
    assert cache.evict(10) == 0
    cache.check_integrity()
    put(alloc, cache, [1, 2, 3])
    assert cache.match_prefix([1, 2, 3]).length == 3
    cache.check_integrity()


def test_stats_count_queries_and_hits() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])  # inserts are not queries
    assert cache.stats.queried_tokens == 0 and cache.stats.hit_rate == 0.0
    cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.match_prefix([9])
    assert (cache.stats.queried_tokens, cache.stats.hit_tokens) == (7, 4)
    assert cache.stats.hit_rate == pytest.approx(4 / 7)
    cache.reset_stats()
    assert (cache.stats.queried_tokens, cache.stats.hit_tokens) == (0, 0)


def test_check_integrity_catches_leaked_slot() -> None:
    alloc, cache = make(num_slots=8)
    put(alloc, cache, [1, 2])
    running = alloc.alloc(3)
    assert running is not None
    cache.check_integrity(live_slots=[running])
    with pytest.raises(AssertionError, match="leaked"):
        cache.check_integrity()  # the running request's slots unaccounted for


def test_check_integrity_catches_double_ownership() -> None:
    alloc, cache = make(num_slots=8)
    put(alloc, cache, [1, 2])
    tree_slots = cache.match_prefix([1, 2]).slots
    with pytest.raises(AssertionError, match="more than once"):
        cache.check_integrity(live_slots=[tree_slots[:1]])  # a request claims a tree slot
    plain = SlotAllocator(8)  # no debug: the double free goes unnoticed by the allocator
    cache2 = RadixCache(plain)
    put(plain, cache2, [1, 2])
    plain.free(cache2.match_prefix([1, 2]).slots[1:])  # a tree slot freed behind the tree's back
    with pytest.raises(AssertionError, match=r"more than once: \{1: \{'free': 1, 'tree': 1\}\}"):
        cache2.check_integrity()


def test_check_integrity_catches_bad_counters_and_locks() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    cache.match_prefix([1])
    cache.check_integrity()
    cache.evictable_size += 1
    with pytest.raises(AssertionError, match="counters"):
        cache.check_integrity()
    cache.evictable_size -= 1
    child = cache.match_prefix([1, 2, 3]).last_node
    child.lock_ref = 1  # locked without its parent
    with pytest.raises(AssertionError, match="lock count"):
        cache.check_integrity()


def test_heap_stays_bounded_under_repeated_matches() -> None:
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [4, 5])
    for _ in range(5000):
        cache.match_prefix([1, 2, 3])
    assert len(cache._leaves) <= 2 * cache.num_nodes + 1025
    cache.check_integrity()
    alloc.take_freed()
    assert cache.evict(1) == 2 and alloc.take_freed() == [3, 4]
