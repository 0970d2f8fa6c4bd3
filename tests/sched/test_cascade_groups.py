"""Grouping decode rows by the radix-tree prefix they share (sched/cascade.py)."""

from __future__ import annotations

from typing import Any

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.radix_tree import RadixCache
from radixserve.sched.cascade import PrefixGrouper, group_by_prefix


def tree() -> RadixCache:
    return RadixCache(SlotAllocator(100_000))


def locked(cache: RadixCache, key: list[int]) -> Any:
    """Insert `key` (fresh slots) and return the node a request holding it would lock."""
    slots = cache.allocator.alloc(len(key))
    assert slots is not None
    cached = cache.insert(key, slots)
    cache.allocator.free(slots[:cached])
    m = cache.match_prefix(key)
    cache.lock(m.last_node)
    return m.last_node


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_rows_under_a_long_shared_prefix_form_one_group() -> None:
    c = tree()
    prefix = seq(0, 300)
    nodes = [locked(c, prefix + seq(10_000 + 100 * i, 8)) for i in range(4)]
    nodes.insert(2, locked(c, seq(50_000, 400)))  # unrelated: a singleton
    groups = group_by_prefix(nodes, min_shared=256)
    assert groups is not None
    assert groups.rows == ((0, 1, 3, 4),) and groups.prefix_lens == (300,)
    assert groups.saved_tokens == 3 * 300


def test_fork_of_one_prompt_groups_with_the_split_node() -> None:
    # n > 1: the first completion locks the whole prompt, the others its prompt[:-1] (a split).
    c = tree()
    prompt = seq(0, 500)
    first = locked(c, prompt)
    rest = [c.match_prefix(prompt[:-1]).last_node for _ in range(3)]
    groups = group_by_prefix([first, *rest], min_shared=256)
    assert groups is not None and groups.rows == ((0, 1, 2, 3),) and groups.prefix_lens == (499,)


def test_deeper_groups_win_when_they_save_more() -> None:
    c = tree()
    system = seq(0, 260)
    a = [locked(c, system + seq(1000, 2000) + [7000 + i]) for i in range(3)]  # share 2260
    b = [locked(c, system + seq(5000, 2000) + [8000 + i]) for i in range(3)]
    groups = group_by_prefix([*a, *b], min_shared=256)
    assert groups is not None
    assert groups.rows == ((0, 1, 2), (3, 4, 5)) and groups.prefix_lens == (2260, 2260)
    # Below the threshold nothing groups; a shallower common node wins when the deep ones are pairs.
    assert group_by_prefix([*a, *b], min_shared=3000) is None
    c2 = tree()
    shared = seq(0, 1000)
    pairs = [locked(c2, shared + seq(2000 + 10 * (i // 2), 5) + [9000 + i]) for i in range(8)]
    g2 = group_by_prefix(pairs, min_shared=256)
    assert g2 is not None and g2.rows == (tuple(range(8)),) and g2.prefix_lens == (1000,)


def test_grouper_caches_and_counts() -> None:
    c = tree()
    nodes = [locked(c, seq(0, 300) + [900 + i]) for i in range(2)]
    g = PrefixGrouper(256)
    first = g.group(nodes)
    assert g.group(nodes) is first and g.steps == 2 and g.saved_tokens == 2 * 300
    assert g.group([nodes[0], None]) is None and g.steps == 2
    assert PrefixGrouper(256, min_saved=301).group(nodes) is None  # saves 300: not worth a step
