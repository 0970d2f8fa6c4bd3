"""Replicas: N engines behind one `AsyncEngine` API and a cache-aware router.

`AsyncEngine(EngineConfig(data_parallel_size=N))` is a `DataParallelEngine`
(`replicas/engine.py`): N full engines (one per device, each with its worker
thread) in the caller's event loop, and a `Router` (`replicas/router.py`) that
sends each request to the replica whose radix cache most likely holds its
prefix (`replicas/prefix_index.py`). Nothing below the engine knows replicas exist.

This package's `__init__` imports nothing: `radixserve.config` reads
`replicas.config` while the engine modules are still being imported.
"""
