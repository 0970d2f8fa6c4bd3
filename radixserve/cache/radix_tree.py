"""`RadixCache`: a radix tree over token ids whose nodes own KV slots.

Every prompt and every finished generation leaves its KV here; a later
request that shares a prefix gets those slots from `match_prefix` and skips
that part of its prefill. Edges carry token sequences (a tuple per node, its
slots as an int64 tensor of the same length); children are keyed by their
first token (their first page when `page_size > 1`), and at the root by
`(extra_key, first token/page)` so namespaces never share a node.

The ownership rules and the lock protocol are on `RadixCache`.

Access times come from a counter bumped once per `match_prefix`/`insert`,
not the wall clock, so the eviction order is deterministic. The node types
are in `cache/tree_node.py`, the eviction heap in `cache/eviction.py` and
the full invariant check in `cache/integrity.py`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.eviction import LeafHeap
from radixserve.cache.integrity import check_tree
from radixserve.cache.tree_node import CacheStats, Key, MatchResult, TreeNode, as_key, common_prefix_len

__all__ = ["CacheStats", "MatchResult", "RadixCache", "TreeNode"]


class RadixCache:
    """Radix tree of cached KV slots, with the lock protocol its one caller (the scheduler) follows.

    `page_size` is the matching granularity: matches and inserts are
    truncated to whole pages (the allocator stays token-level). Sizes are in
    tokens: `evictable_size` (on no locked path), `protected_size` (on some
    locked path), `total_size` (their sum).

    Ownership: every slot of the allocator is exactly one of free, owned by
    the tree (some node's `slots`), or owned by one running request (slots it
    allocated and has not handed to the tree). `check_integrity` asserts it.

    1. Admit: `m = cache.match_prefix(prompt)`, then `cache.lock(m.last_node)`
       before anything that may evict (allocation does). From then on the
       request may read `m.slots` (copy them into its `ReqToSlotTable` row);
       the tree still owns them and the request never frees them. Its own new
       slots come from `cache.alloc(n)` (evicts if needed) or the allocator.
    2. Finish: with `tokens` the tokens whose KV the request holds (matched or
       computed), `slots` their slots (`m.slots` then its own) and
       `own_start = m.length`::

           cached = cache.insert(tokens, slots)        # >= own_start
           allocator.free(slots[own_start:cached])     # duplicates: another request
                                                       # cached these meanwhile
           allocator.free(slots[cache.page_aligned(len(tokens)):])  # partial page
           cache.unlock(m.last_node)                   # only now: insert relies on the
                                                       # locked prefix being cached

       The tree owns `slots[cached:page_aligned(len(tokens))]` from then on.
    3. Keep running after caching (chunked prefill): the same `insert` and
       first `free`, but keep the partial page; then
       `m2 = cache.match_prefix(tokens)` (now `m2.length ==
       page_aligned(len(tokens))`), `cache.lock(m2.last_node)`,
       `cache.unlock(m.last_node)`, write `m2.slots` over the row's first
       `m2.length` positions (the tree's copies replace the freed duplicates)
       and go on with `m2` as the match (`own_start = m2.length`).
    4. Abort / retract: `allocator.free(slots[own_start:])`, then
       `cache.unlock(m.last_node)`.

    `evict` frees only unlocked leaves, least recently used first: a slot a
    running request reads is on its locked path and is never freed.
    """

    def __init__(self, allocator: SlotAllocator, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self._empty = torch.empty(0, dtype=torch.int64, device=allocator.device)
        self._next_id = 0
        self._clock = 0
        self.root = self._new_node((), self._empty, None, None)
        self._leaves = LeafHeap(self.root)  # evictable leaves, least recently used first
        # Read-only outside the tree (check_integrity recounts them).
        self.evictable_size = 0  # tokens on no locked path
        self.protected_size = 0  # tokens on some locked path
        self.num_nodes = 0  # excluding the root
        self.reset_stats()

    # ---- sizes and statistics -------------------------------------------------------------

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    @property
    def stats(self) -> CacheStats:
        return CacheStats(queried_tokens=self._queried, hit_tokens=self._hits)

    def reset_stats(self) -> None:
        self._queried = 0
        self._hits = 0

    def page_aligned(self, n: int) -> int:
        """`n` rounded down to whole pages: how much of an `n`-token key the tree can hold."""
        return n - n % self.page_size

    # ---- match / insert -------------------------------------------------------------------

    def match_prefix(self, key: Sequence[int] | torch.Tensor, extra_key: str | None = None) -> MatchResult:
        """The longest cached prefix of `key` in namespace `extra_key`, in whole pages.

        If the match ends inside an edge, that node is split so that
        `last_node` ends exactly at the match. Refreshes the access time of
        every node on the path and counts the query in `stats`.

        The returned slots are safe to use only once `lock(result.last_node)`
        has been called, and until the matching `unlock`: any eviction in
        between (e.g. from an allocation) may free them. A scheduler that must
        compute at least one token (to get logits) matches `key[:-1]`.
        """
        key = as_key(key)
        parts: list[torch.Tensor] = []
        node, pos = self._walk(key, extra_key, parts)
        self._refresh_leaf(node)
        self._queried += len(key)
        self._hits += pos
        if not parts:
            slots = self._empty
        elif len(parts) == 1:
            slots = parts[0]
        else:
            slots = torch.cat(parts)
        return MatchResult(slots=slots, last_node=node)

    def insert(
        self, key: Sequence[int] | torch.Tensor, slots: torch.Tensor, extra_key: str | None = None
    ) -> int:
        """Cache `key` (whole pages only) whose KV lives in `slots` (`len(slots) == len(key)`).

        Returns `cached`: how many leading tokens of `key` were already in the
        tree (a multiple of `page_size`). The tree keeps its own slots for
        those and takes ownership of `slots[cached:page_aligned(len(key))]`.
        The caller still owns, and must free, the rest of its slots:

        - `slots[own_start:cached]`, where `own_start` is the length of the
          match it locked (tokens it computed itself that someone else cached
          meanwhile). `slots[:own_start]` are the tree's; never free them.
        - `slots[page_aligned(len(key)):]`, the partial last page, if the
          request is done with it.

        Call it before unlocking the request's match: the locked prefix is
        then guaranteed cached, so `cached >= own_start`. Refreshes access
        times along the path, like `match_prefix` (but counts no statistics).
        """
        key = as_key(key)
        if slots.dim() != 1 or slots.shape[0] != len(key):
            raise ValueError(
                f"insert needs one slot per token: {len(key)} tokens, slots {tuple(slots.shape)}"
            )
        end = self.page_aligned(len(key))
        node, pos = self._walk(key, extra_key, None)
        cached = pos
        if pos < end:
            new_slots = slots[pos:end].to(device=self.allocator.device, dtype=torch.int64, copy=True)
            leaf = self._new_node(key[pos:end], new_slots, node, self._child_key(node, key, pos, extra_key))
            node.children[leaf.child_key] = leaf
            self.num_nodes += 1
            self.evictable_size += end - pos
            node = leaf
        self._refresh_leaf(node)
        return cached

    # ---- locks ----------------------------------------------------------------------------

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one reference each).

        Lock a match's `last_node` right after `match_prefix`, before any
        allocation or eviction; pair every lock with exactly one `unlock`.
        Locking the root (an empty match) is a no-op.
        """
        if node.parent is None and node is not self.root:
            raise ValueError(f"cannot lock {node}: it was evicted")
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        """Drop one reference taken by `lock(node)`.

        A request unlocks when it finishes (after `insert`), or when it is
        aborted or retracted (after freeing its own slots). Nodes whose count
        drops to zero become evictable again.
        """
        if node is not self.root and node.lock_ref <= 0:
            raise RuntimeError(f"unlock of {node}, which is not locked")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_size -= len(node.key)
                self.evictable_size += len(node.key)
                if not node.children:
                    self._leaves.push(node, self.num_nodes)
            node = node.parent  # type: ignore[assignment]

    # ---- eviction and allocation ----------------------------------------------------------

    def evict(self, n_tokens: int) -> int:
        """Free at least `n_tokens` slots through the allocator, if that many are evictable.

        Removes unlocked leaves, least recently used first (ties: older node
        first); a parent left as an unlocked leaf becomes a candidate too.
        Leaves go whole, so it may free more than asked. Never touches a node
        on a locked path. Returns the number of slots freed (less than asked
        only when nothing evictable is left).
        """
        freed = 0
        out: list[torch.Tensor] = []
        while freed < n_tokens and (node := self._leaves.pop()) is not None:
            parent = node.parent
            assert parent is not None
            del parent.children[node.child_key]
            node.parent = None
            self.num_nodes -= 1
            self.evictable_size -= len(node.key)
            freed += len(node.key)
            out.append(node.slots)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                self._leaves.push(parent, self.num_nodes)
        if out:
            self.allocator.free(torch.cat(out) if len(out) > 1 else out[0])
        return freed

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` slots from the allocator, evicting first if too few are free.

        Returns None (and evicts nothing) when even evicting everything
        evictable would not make room. Lock every match you still need
        before calling this.
        """
        short = n - self.allocator.num_free
        if short > 0:
            if short > self.evictable_size:
                return None
            self.evict(short)
        return self.allocator.alloc(n)

    def reset(self) -> None:
        """Drop the whole tree, freeing all its slots; nothing may be locked."""
        if self.protected_size:
            raise RuntimeError(f"reset with {self.protected_size} tokens on locked paths")
        parts: list[torch.Tensor] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            parts.append(node.slots)
            node.parent = None  # stale handles now fail to lock
            stack.extend(node.children.values())
        if parts:
            self.allocator.free(torch.cat(parts))
        self.root.children = {}
        self._leaves.clear()
        self.evictable_size = 0
        self.num_nodes = 0

    # ---- integrity ------------------------------------------------------------------------

    def check_integrity(self, live_slots: Iterable[torch.Tensor] = ()) -> None:
        """Raise AssertionError unless the tree and the allocator agree (see `cache/integrity.py`).

        `live_slots`: the slots running requests own and have not inserted
        (not their matched prefixes, which the tree owns).
        """
        check_tree(self, self._leaves.entries(), live_slots)

    # ---- internals ------------------------------------------------------------------------

    def _walk(
        self, key: Key, extra_key: str | None, parts: list[torch.Tensor] | None
    ) -> tuple[TreeNode, int]:
        """The one walk `match_prefix` and `insert` share: follow `key` down in whole pages.

        Stamps every node on the path with a new access time; splits the edge the
        match ends inside, so that the node returned ends exactly at `pos`, the
        matched length. Appends each node's slots to `parts` when given.
        """
        end = self.page_aligned(len(key))
        self._clock += 1
        now = self._clock
        node, pos = self.root, 0
        while pos < end:
            child = node.children.get(self._child_key(node, key, pos, extra_key))
            if child is None:
                break
            m = self.page_aligned(common_prefix_len(child.key, key, pos, end))
            partial = m < len(child.key)
            if partial:  # the match ends (or diverges) inside this edge
                child = self._split(child, m)
            child.last_access = now
            if parts is not None:
                parts.append(child.slots)
            node, pos = child, pos + m
            if partial:
                break
        return node, pos

    def _child_key(self, parent: TreeNode, key: Key, pos: int, extra_key: str | None) -> Hashable:
        first: Hashable = key[pos] if self.page_size == 1 else key[pos : pos + self.page_size]
        return (extra_key, first) if parent is self.root else first

    def _new_node(
        self, key: Key, slots: torch.Tensor, parent: TreeNode | None, child_key: Hashable, lock_ref: int = 0
    ) -> TreeNode:
        self._next_id += 1
        return TreeNode(key, slots, parent, child_key, self._clock, self._next_id, lock_ref)

    def _split(self, node: TreeNode, m: int) -> TreeNode:
        """Cut `node` after `m` tokens; return the new upper half (`node` keeps the rest)."""
        parent = node.parent
        assert parent is not None and 0 < m < len(node.key)
        upper = self._new_node(node.key[:m], node.slots[:m], parent, node.child_key, node.lock_ref)
        upper.last_access = node.last_access
        parent.children[upper.child_key] = upper
        node.key = node.key[m:]
        node.slots = node.slots[m:]
        node.parent = upper
        node.child_key = self._child_key(upper, node.key, 0, None)
        upper.children[node.child_key] = node
        self.num_nodes += 1
        return upper

    def _refresh_leaf(self, node: TreeNode) -> None:
        """Re-file `node` in the heap after its access time changed, if it is an evictable leaf."""
        if node is not self.root and not node.children and node.lock_ref == 0:
            self._leaves.push(node, self.num_nodes)

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, nodes={self.num_nodes}, "
            f"evictable={self.evictable_size}, protected={self.protected_size})"
        )
