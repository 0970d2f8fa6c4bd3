"""What is remembered: the KV pool, the slot allocator, the per-request slot table and the radix tree."""

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.cache.radix_tree import CacheStats, MatchResult, RadixCache, TreeNode
from radixserve.cache.req_table import ReqToSlotTable

__all__ = [
    "CacheStats",
    "KVPool",
    "KVPoolConfig",
    "MatchResult",
    "RadixCache",
    "ReqToSlotTable",
    "SlotAllocator",
    "TreeNode",
]
