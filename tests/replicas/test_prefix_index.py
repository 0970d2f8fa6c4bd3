"""`PrefixIndex`: the router's guess of a replica's radix cache (no model, no engine)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.replicas.prefix_index import PrefixIndex

DOCS = ((1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 9, 9, 9), (1, 2, 7, 7), (4, 4, 4, 4, 4))
KEYS = st.builds(
    lambda d, n, tail: list(DOCS[d][:n]) + tail,
    st.integers(0, len(DOCS) - 1),
    st.integers(0, 8),
    st.lists(st.integers(0, 9), max_size=3),
)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(KEYS, st.sampled_from([None, "ns"])), max_size=12), KEYS)
def test_match_is_the_longest_common_prefix_with_what_was_inserted(
    inserted: list[tuple[list[int], str | None]], probe: list[int]
) -> None:
    index = PrefixIndex(capacity=10_000)
    for key, ns in inserted:
        index.insert(key, ns)
    for ns in (None, "ns"):
        want = max((_lcp(k, probe) for k, n in inserted if n == ns), default=0)
        assert index.match(probe, ns).length == want
    # size counts each distinct (namespace, prefix) token once
    distinct = {(ns, tuple(k[: i + 1])) for k, ns in inserted for i in range(len(k))}
    assert index.size == len(distinct)


def test_confirmed_part_of_a_match() -> None:
    index = PrefixIndex(capacity=100)
    index.insert([1, 2, 3, 4], confirmed=True)
    index.insert([1, 2, 3, 4, 5, 6])  # routed there, not finished yet
    m = index.match([1, 2, 3, 4, 5, 6, 7])
    assert (m.length, m.confirmed) == (6, 4)
    index.insert([1, 2, 3, 4, 5, 6], confirmed=True)
    assert index.match([1, 2, 3, 4, 5, 6, 7]).confirmed == 6


def test_capacity_evicts_least_recently_used_leaves() -> None:
    index = PrefixIndex(capacity=12)
    index.insert([1, 1, 1, 1])
    index.insert([2, 2, 2, 2])
    index.insert([3, 3, 3, 3])
    index.insert([1, 1, 1, 1, 5])  # touches [1...] again: [2...] is now the oldest
    assert index.size == 9 and index.evicted_tokens == 4  # one whole leaf, as the replica evicts
    assert index.match([2, 2, 2, 2]).length == 0
    assert index.match([1, 1, 1, 1, 5]).length == 5
    assert index.match([3, 3, 3, 3]).length == 4


def test_eviction_feedback_forgets_what_is_no_newer_than_the_evicted_node() -> None:
    index = PrefixIndex(capacity=100)
    index.insert([1, 1, 1, 1], confirmed=True)  # oldest
    index.insert([2, 2, 2, 2], confirmed=True)
    index.insert([3, 3, 3, 3], confirmed=True)  # newest
    found = index.match([2, 2, 2, 2, 9])
    assert found.confirmed == 4
    index.insert([2, 2, 2, 2, 9])  # routed: touched now
    # The replica served none of it: it evicted [2...], and so [1...] before it; [3...] is newer.
    assert index.forget_evicted(found, cached=0) == 4
    assert index.match([1, 1, 1, 1]).length == 0
    assert index.match([3, 3, 3, 3]).length == 4
    assert index.match([2, 2, 2, 2, 9]).length == 5  # the request just put it back
    assert index.size == 9 and index.forgotten_tokens == 4


def test_feedback_that_matches_the_promise_forgets_nothing() -> None:
    index = PrefixIndex(capacity=100)
    index.insert([1, 2, 3], confirmed=True)
    found = index.match([1, 2, 3, 4])
    assert index.forget_evicted(found, cached=3) == 0
    assert index.size == 3


def test_namespaces_and_clear() -> None:
    index = PrefixIndex(capacity=100)
    index.insert([1, 2, 3], "lora-a")
    assert index.match([1, 2, 3]).length == 0
    assert index.match([1, 2, 3], "lora-a").length == 3
    index.clear()
    assert index.size == 0 and index.match([1, 2, 3], "lora-a").length == 0
