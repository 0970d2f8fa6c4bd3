"""`merge_stats`: one `stats()` dict for an engine of replicas.

The replicas' counters are summed (every one of them is a count, a size or a
time, so the sum is the engine's), the router's are added under `router_`, and
each replica gets a few keys of its own (`replica<i>_...`): whether it is
healthy, its requests in flight and the requests sent to it. A failed replica
counts in none of the sums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from radixserve.replicas.router import Router

Stats = dict[str, int | float]


def merge_stats(per_replica: Sequence[Mapping[str, int | float] | None], router: Router) -> Stats:
    """`per_replica[i]`: replica i's `stats()`, None for one that failed."""
    total: Stats = {}
    for stats in per_replica:
        if stats is None:
            continue
        for key, value in stats.items():
            total[key] = total.get(key, 0) + value
    healthy = [s is not None for s in per_replica]
    total["replicas"] = len(per_replica)
    total["replicas_healthy"] = sum(healthy)
    total.update(router.stats().as_dict())
    for i, ok in enumerate(healthy):
        total[f"replica{i}_healthy"] = int(ok)
        total[f"replica{i}_in_flight"] = router.load[i]
        total[f"replica{i}_routed"] = router.routed[i]
    return total
