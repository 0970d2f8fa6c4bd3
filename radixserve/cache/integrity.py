"""`check_tree`: the radix tree's invariants and the slot-ownership rule, checked in full.

Tests call it (through `RadixCache.check_integrity`) after every scenario: it walks the
whole tree and bincounts every slot, so it is for tests and debugging, never the hot loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.tree_node import TreeNode


class CheckedTree(Protocol):
    """What the check reads of a `RadixCache` (radix_tree.py imports this module, not the reverse)."""

    root: TreeNode
    page_size: int
    allocator: SlotAllocator
    num_nodes: int
    evictable_size: int
    protected_size: int


def check_tree(
    cache: CheckedTree, heap_entries: set[tuple[int, int]], live_slots: Iterable[torch.Tensor] = ()
) -> None:
    """Raise AssertionError unless `cache` and its allocator agree.

    `heap_entries`: (last access, node id) of every leaf in the eviction heap.

    `live_slots`: the slots running requests own and have not inserted
    (not their matched prefixes, which the tree owns). Checks that every
    allocator slot is exactly one of free / in the tree / live, that the
    size counters add up, that each node's lock count is at least the sum
    of its children's, that parents were accessed no earlier than their
    children, and that every evictable leaf is in the eviction heap.
    """
    root, page_size = cache.root, cache.page_size
    evictable = protected = nodes = 0
    tree_parts: list[torch.Tensor] = []
    stack = [root]
    while stack:
        node = stack.pop()
        child_locks = 0
        for ck, child in node.children.items():
            first = child.key[0] if page_size == 1 else child.key[:page_size]
            _require(child.parent is node, f"{child} has a wrong parent")
            _require(child.child_key == ck, f"{child} is filed under {ck!r}")
            filed = ck[1] if node is root and isinstance(ck, tuple) else ck  # root: (extra_key, first)
            _require(filed == first, f"{child} filed under {ck!r}")
            _require(len(child.key) > 0 and len(child.key) % page_size == 0, f"{child}: bad length")
            _require(child.slots.shape == (len(child.key),), f"{child}: {child.slots.shape[0]} slots")
            _require(child.lock_ref >= 0, f"{child}: negative lock count")
            if node is not root:
                _require(child.last_access <= node.last_access, f"{child} accessed after its parent")
            child_locks += child.lock_ref
            stack.append(child)
        if node is root:
            continue
        nodes += 1
        tree_parts.append(node.slots)
        _require(node.lock_ref >= child_locks, f"{node}: lock count below its children's ({child_locks})")
        if node.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            if not node.children:
                _require((node.last_access, node.id) in heap_entries, f"evictable leaf {node} not in heap")
    _require(nodes == cache.num_nodes, f"num_nodes {cache.num_nodes}, tree has {nodes}")
    _require(
        (evictable, protected) == (cache.evictable_size, cache.protected_size),
        f"counters evictable={cache.evictable_size} protected={cache.protected_size}, "
        f"tree has evictable={evictable} protected={protected}",
    )
    _check_slots(cache, tree_parts, list(live_slots))


def _check_slots(cache: CheckedTree, tree_parts: list[torch.Tensor], live_parts: list[torch.Tensor]) -> None:
    allocator = cache.allocator
    num_slots = allocator.num_slots
    groups = {"free": [allocator.free_slots()], "tree": tree_parts, "live": live_parts}
    counts = {}
    for name, parts in groups.items():
        flat = torch.cat([p.reshape(-1).to("cpu", torch.int64) for p in parts]) if parts else None
        if flat is None or flat.numel() == 0:
            counts[name] = torch.zeros(num_slots, dtype=torch.int64)
            continue
        bad = flat[(flat < 0) | (flat >= num_slots)]
        _require(bad.numel() == 0, f"{name} slots outside [0, {num_slots}): {bad[:8].tolist()}")
        counts[name] = torch.bincount(flat, minlength=num_slots)
    total = counts["free"] + counts["tree"] + counts["live"]
    lost = (total == 0).nonzero().flatten()[:8].tolist()
    _require(not lost, f"slots neither free, in the tree nor live (leaked): {lost}")
    doubled = (total > 1).nonzero().flatten()[:8].tolist()
    if doubled:
        owners = {s: {n: int(c[s]) for n, c in counts.items() if c[s]} for s in doubled}
        raise AssertionError(f"slots owned more than once: {owners}")


def _require(cond: bool, message: str) -> None:
    if not cond:  # not `assert`: must hold under python -O too
        raise AssertionError(message)
