"""Replicas: N engines behind one `AsyncEngine` API and a cache-aware router.

`AsyncEngine(EngineConfig(data_parallel_size=N))` hands every call to a
`ReplicaSet` (`replicas/replica_set.py`): N full engines (one per device, each
with its worker thread) in the caller's event loop, and a `Router`
(`replicas/router.py`) that sends each request to the replica whose radix cache
most likely holds its prefix (`replicas/prefix_index.py`). This package sits
between engine.py and what engine.py is built from, so it takes the engine
class it makes replicas of as an argument; nothing below the engine knows
replicas exist. `RouterConfig` is in radixserve/config.py.
"""
