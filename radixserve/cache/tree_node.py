"""The radix tree's node and result types, and the key helpers its walk uses."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

Key = tuple[int, ...]


class TreeNode:
    """One edge of the tree: `key` tokens whose KV lives in `slots`.

    Splitting a node keeps this object as the lower half (it still ends at
    the same position), so a request holding it as its `last_node` stays
    valid. `parent is None` means root, or a node that has been evicted.
    """

    __slots__ = ("key", "slots", "children", "parent", "child_key", "lock_ref", "last_access", "id")

    def __init__(
        self,
        key: Key,
        slots: torch.Tensor,
        parent: TreeNode | None,
        child_key: Hashable,
        last_access: int,
        node_id: int,
        lock_ref: int = 0,
    ) -> None:
        self.key = key
        self.slots = slots
        self.children: dict[Hashable, TreeNode] = {}
        self.parent = parent
        self.child_key = child_key  # this node's key in parent.children
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.id = node_id

    @property
    def length(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        head = ", ".join(map(str, self.key[:8])) + (", …" if len(self.key) > 8 else "")
        return f"TreeNode(id={self.id}, key=({head}), len={len(self.key)}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix of a key: its slots (int64, 1-D, read-only: the tree owns them)
    and the node where it ends (lock it before using the slots)."""

    slots: torch.Tensor
    last_node: TreeNode

    @property
    def length(self) -> int:
        return self.slots.shape[0]


@dataclass(frozen=True)
class CacheStats:
    queried_tokens: int  # sum of len(key) over match_prefix calls
    hit_tokens: int  # sum of matched lengths

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def common_prefix_len(edge: Key, key: Key, start: int, end: int) -> int:
    """Length of the common prefix of `edge` and `key[start:end]`.

    Tuple slice comparison runs in C; when the whole range does not match, a
    binary search on slices finds the first difference with O(n) element
    comparisons in total and O(log n) Python steps, instead of a Python loop
    over tokens.
    """
    n = min(len(edge), end - start)
    if key[start : start + n] == edge[:n]:
        return n
    lo, hi = 0, n  # edge[:lo] matches; the first mismatch is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[start + lo : start + mid] == edge[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def as_key(key: Sequence[int] | torch.Tensor) -> Key:
    if isinstance(key, tuple):
        return key
    if hasattr(key, "tolist"):  # torch tensor or numpy array
        return tuple(key.tolist())
    return tuple(key)
