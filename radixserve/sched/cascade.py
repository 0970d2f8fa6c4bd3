"""Which decoding requests share a context prefix, from the radix tree (for cascade attention).

A running request's table row starts with the slots of its locked radix
node's path (`RequestKV.claim` / `cache_prefix` copy them there), and its
own slots follow. Two requests therefore share exactly the first `depth(LCA)`
slots, where LCA is the deepest common ancestor of their locked nodes, and
nothing after that. A node's depth never changes (a split keeps the node
object as the lower half, ending where it did), so neither does the LCA depth
of two locked nodes.

Grouping picks, on the tree of the batch's ancestors at least `min_shared`
tokens deep, the set of nodes that saves the most reads: a node used as a
group saves `(members - 1) * depth` slot reads, against the best its
subtrees can do on their own (a small bottom-up pass). Each request belongs
to at most one group (two cascade levels).

Cost: a walk from each request's node to the root (nodes, not tokens), done
only when the batch's locked nodes change; an unchanged batch reuses the
last grouping after one tuple comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixserve.runtime.cascade import CascadeGroups

if TYPE_CHECKING:
    from radixserve.cache.tree_node import TreeNode


def group_by_prefix(nodes: Sequence[TreeNode | None], min_shared: int) -> CascadeGroups | None:
    """Groups of batch rows (row i locked `nodes[i]`, a radix TreeNode or None)
    sharing at least `min_shared` leading slots; None when no group forms."""
    depth: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    children: dict[int, list[int]] = {}
    tops: list[int] = []
    for row, node in enumerate(nodes):
        chain = []
        n = node
        while n is not None and n.parent is not None:  # up to (not including) the root
            chain.append(n)
            n = n.parent
        d, above = 0, -1
        for anc in reversed(chain):
            d += anc.length
            if d < min_shared:
                continue
            if anc.id not in depth:
                depth[anc.id], members[anc.id], children[anc.id] = d, [], []
                (children[above] if above >= 0 else tops).append(anc.id)
            members[anc.id].append(row)
            above = anc.id
    best: dict[int, int] = {}
    take: dict[int, bool] = {}
    for a in sorted(depth, key=depth.__getitem__, reverse=True):  # children before parents
        own = (len(members[a]) - 1) * depth[a]
        below = sum(best[c] for c in children[a])
        take[a] = own > 0 and own >= below
        best[a] = max(own, below)
    found: list[tuple[tuple[int, ...], int]] = []
    stack = list(tops)
    while stack:
        a = stack.pop()
        if take[a]:
            found.append((tuple(members[a]), depth[a]))
        else:
            stack.extend(children[a])
    if not found:
        return None
    found.sort()
    return CascadeGroups(tuple(g for g, _ in found), tuple(p for _, p in found))


class PrefixGrouper:
    """The scheduler's grouping of decode batches, cached while the batch's locked nodes stay the same.

    `min_shared` tokens is the least prefix worth a level of its own (below
    that, the extra kernel and merge cost more than the reads they save);
    `min_saved` is the least a step's groups must save in all (slot reads per
    layer) for the step to use them, since a cascade step also gives up its
    CUDA graph.
    """

    def __init__(self, min_shared: int, min_saved: int = 0) -> None:
        if min_shared < 1 or min_saved < 0:
            raise ValueError(f"need min_shared >= 1 and min_saved >= 0, got {min_shared}, {min_saved}")
        self.min_shared = min_shared
        self.min_saved = min_saved
        self._key: tuple[int, ...] | None = None
        self._groups: CascadeGroups | None = None
        self.steps = 0  # decode steps that carried groups
        self.saved_tokens = 0  # slot reads those steps avoided (per layer)

    def group(self, lock_nodes: Sequence[TreeNode | None]) -> CascadeGroups | None:
        # Node ids are unique for the tree's lifetime (unlike id()), so an equal key is the same nodes.
        key = tuple(-1 if n is None else n.id for n in lock_nodes)
        if key != self._key:
            groups = group_by_prefix(lock_nodes, self.min_shared)
            if groups is not None and groups.saved_tokens < self.min_saved:
                groups = None
            self._key, self._groups = key, groups
        return self.again()

    def again(self) -> CascadeGroups | None:
        """The groups of the last `group` call, for a batch of the same requests (same nodes)."""
        if self._groups is not None:
            self.steps += 1
            self.saved_tokens += self._groups.saved_tokens
        return self._groups
