"""`PrefixIndex`: the router's guess of what one replica's radix cache holds (token ids only).

A radix tree over token ids, like the replica's own (`cache/radix_tree.py`) but
without KV: edges carry token tuples, children are keyed by their first token,
and each namespace (`extra_key`) has its own root. The router inserts a prompt
when it sends it to the replica (*pending*: the replica has not computed it
yet) and the prompt plus its output when the request finishes there
(*confirmed*: the replica's tree got those tokens then).

The guess goes stale as the replica evicts, so it is bounded and corrected:

- at most `capacity` tokens (the replica's KV pool by default), least recently
  used leaves dropped first, as the replica's own tree does;
- eviction feedback: a request whose replica served fewer cached tokens than
  the index's confirmed match promised (`Usage.cached_tokens`) proves that the
  replica evicted the node at that depth. Its LRU drops older nodes first, so
  every node last touched no later than that one is forgotten too
  (`forget_evicted`).

Access times are a counter bumped per `insert`, so they only grow from
leaf to root along a path: a node is never older than its children.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass


class _Node:
    __slots__ = ("tokens", "children", "parent", "last", "confirmed")

    def __init__(self, tokens: tuple[int, ...], parent: _Node | None, last: int, confirmed: bool) -> None:
        self.tokens = tokens
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last = last  # access counter of the last match or insert through this node
        self.confirmed = confirmed  # some request through it finished on the replica


@dataclass(frozen=True)
class PrefixMatch:
    """What the index holds of one prompt, as seen when it was routed."""

    length: int  # tokens matched, pending or confirmed
    confirmed: int  # ...of which the replica had confirmed
    # (end depth, last access before this match) of each confirmed node on the path, root first:
    # the evidence `forget_evicted` reads when the replica turns out to have less.
    stamps: tuple[tuple[int, int], ...] = ()


NO_MATCH = PrefixMatch(0, 0)


class PrefixIndex:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"PrefixIndex capacity must be >= 1 token, got {capacity}")
        self.capacity = capacity
        self._roots: dict[str | None, _Node] = {}
        self._clock = itertools.count(1)
        self.size = 0  # tokens held (sum of edge lengths)
        self.evicted_tokens = 0  # dropped for capacity
        self.forgotten_tokens = 0  # dropped on eviction feedback

    def match(self, key: Sequence[int], namespace: str | None = None) -> PrefixMatch:
        """The longest held prefix of `key` (a read: `insert` touches the path of the one chosen)."""
        node = self._roots.get(namespace)
        if node is None:
            return NO_MATCH
        depth, confirmed, stamps = 0, 0, []
        n = len(key)
        while depth < n:
            child = node.children.get(key[depth])
            if child is None:
                break
            common = _common(child.tokens, key, depth)
            if child.confirmed:
                stamps.append((depth + common, child.last))
                confirmed = depth + common
            depth += common
            if common < len(child.tokens):
                break
            node = child
        return PrefixMatch(depth, confirmed, tuple(stamps))

    def insert(self, key: Sequence[int], namespace: str | None = None, *, confirmed: bool = False) -> None:
        """Hold `key` (touched now); `confirmed`: the replica's tree has it. Evicts over capacity."""
        if not key:
            return
        now = next(self._clock)
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = _Node((), None, now, True)
        root.last = now
        node, depth, n = root, 0, len(key)
        while depth < n:
            child = node.children.get(key[depth])
            if child is None:
                leaf = _Node(tuple(key[depth:]), node, now, confirmed)
                node.children[key[depth]] = leaf
                self.size += n - depth
                break
            common = _common(child.tokens, key, depth)
            if common < len(child.tokens):
                child = self._split(child, common)
            child.last = now
            child.confirmed = child.confirmed or confirmed
            depth += common
            node = child
        if self.size > self.capacity:
            self.evicted_tokens += self._evict_lru(self.size - self.capacity)

    def forget_evicted(self, found: PrefixMatch, cached: int) -> int:
        """The replica served only `cached` tokens of a prompt `found` promised more of: forget
        every node last touched no later than the first confirmed node it lacked. Returns the
        tokens forgotten."""
        stale = next((last for end, last in found.stamps if end > cached), None)
        if stale is None:
            return 0
        gone = sum(_drop_older(root, stale) for root in self._roots.values())
        self.size -= gone
        self.forgotten_tokens += gone
        return gone

    def clear(self) -> None:
        """Forget everything (the replica flushed its cache, or failed)."""
        self._roots.clear()
        self.size = 0

    # ---- internals ------------------------------------------------------------------------

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.tokens[:at], parent, child.last, child.confirmed)
        parent.children[child.tokens[0]] = upper
        child.tokens = child.tokens[at:]
        child.parent = upper
        upper.children[child.tokens[0]] = child
        return upper

    def _evict_lru(self, need: int) -> int:
        """Drop least recently used leaves until `need` tokens are gone; returns the tokens dropped."""
        order = itertools.count()  # ties broken by discovery, never by comparing nodes
        heap = [(leaf.last, next(order), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < need:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            freed += len(leaf.tokens)
            if parent.parent is not None and not parent.children:
                heapq.heappush(heap, (parent.last, next(order), parent))
        self.size -= freed
        return freed

    def _leaves(self) -> list[_Node]:
        out: list[_Node] = []
        stack = [c for r in self._roots.values() for c in r.children.values()]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out


def _common(edge: tuple[int, ...], key: Sequence[int], start: int) -> int:
    """Length of the common prefix of `edge` and `key[start:]`."""
    n = min(len(edge), len(key) - start)
    if tuple(key[start : start + n]) == edge[:n]:  # the common case, in C
        return n
    i = 0
    while i < n and edge[i] == key[start + i]:
        i += 1
    return i


def _drop_older(root: _Node, stale: int) -> int:
    """Drop the subtrees below `root` last touched no later than `stale`; returns their tokens."""
    gone, stack = 0, [root]
    while stack:
        node = stack.pop()
        for first, child in list(node.children.items()):
            if child.last <= stale:  # its whole subtree is no newer than it
                del node.children[first]
                gone += _subtree_tokens(child)
            else:
                stack.append(child)
    return gone


def _subtree_tokens(node: _Node) -> int:
    total, stack = 0, [node]
    while stack:
        n = stack.pop()
        total += len(n.tokens)
        stack.extend(n.children.values())
    return total
