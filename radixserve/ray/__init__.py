"""radixserve on Ray Serve (`pip install "radixserve[ray]"`): `build_app(config, num_replicas)`.

Each replica wraps an `AsyncEngine` (`replica.py`); an ingress serves the same
OpenAI-compatible and native routes as `create_app` (`ingress.py`); a custom
request router sends requests by prefix affinity, with the in-process router's
index and rule (`router.py`). `radixserve serve --ray --replicas N` starts it
on a local Ray, or on a cluster with `--ray-address` (README, "Replicas").
"""

from radixserve.ray.app import build_app

__all__ = ["build_app"]
