"""`LeafHeap`: the radix tree's eviction candidates, least recently used first.

Evictable leaves sit in a heap keyed by (last access, node id) with lazy
invalidation: an entry whose node has since been touched, locked, given a
child or evicted is dropped when popped, so eviction never rescans the tree.
The heap rebuilds itself from the tree only when stale entries make it
outgrow the tree (amortised: a rebuild costs a walk of the tree).
"""

from __future__ import annotations

import heapq

from radixserve.cache.tree_node import TreeNode


class LeafHeap:
    def __init__(self, root: TreeNode) -> None:
        self._root = root
        self._heap: list[tuple[int, int, TreeNode]] = []  # (last_access, id, node)

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, node: TreeNode, num_nodes: int) -> None:
        """File `node` (an unlocked leaf) under its current access time; `num_nodes`: the
        tree's size, against which stale entries are counted."""
        heapq.heappush(self._heap, (node.last_access, node.id, node))
        if len(self._heap) > 2 * num_nodes + 1024:  # mostly stale: refile the live leaves
            self.rebuild()

    def pop(self) -> TreeNode | None:
        """The least recently used node that is still an unlocked, untouched leaf; None when none is."""
        heap = self._heap
        while heap:
            stamp, _, node = heapq.heappop(heap)
            if node.parent is None or node.children or node.lock_ref or node.last_access != stamp:
                continue  # stale: evicted, grew a child, locked, or touched since pushed
            return node
        return None

    def entries(self) -> set[tuple[int, int]]:
        """(last access, node id) of every entry, stale ones included (for integrity checks)."""
        return {(stamp, node_id) for stamp, node_id, _ in self._heap}

    def rebuild(self) -> None:
        """Refile exactly the tree's unlocked leaves, dropping every stale entry."""
        heap: list[tuple[int, int, TreeNode]] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock_ref == 0:
                heap.append((node.last_access, node.id, node))
        heapq.heapify(heap)
        self._heap = heap

    def clear(self) -> None:
        self._heap = []
