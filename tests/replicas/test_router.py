"""`Router`: its decisions on the token ids alone (no model, no engine)."""

from __future__ import annotations

import pytest

from radixserve import EngineDeadError
from radixserve.config import RouterConfig
from radixserve.replicas.router import Decision, Router

PREFIX = list(range(100, 180))  # 80 shared tokens
UP2 = [True, True]


def _ask(i: int) -> list[int]:
    return PREFIX + [i, i + 1]


def test_requests_sharing_a_prefix_follow_it_and_new_prefixes_spread() -> None:
    router = Router(RouterConfig(), capacities=[10_000, 10_000])
    first = router.route(_ask(1), None, 1, UP2)
    assert first.decision is Decision.LEAST_LOADED
    other = router.route(list(range(500, 580)), None, 1, UP2)  # a new prefix: the other replica
    assert other.decision is Decision.LEAST_LOADED and other.replica != first.replica
    for i in range(2, 6):
        p = router.route(_ask(i), None, 1, UP2)
        assert (p.replica, p.decision) == (first.replica, Decision.PREFIX)
        assert p.found.length == len(PREFIX)
    s = router.stats()
    assert (s.decisions_prefix, s.decisions_least_loaded) == (4, 2)
    assert s.predicted_tokens == 4 * len(PREFIX)
    assert router.load[first.replica] == 5 and router.routed[first.replica] == 5


def test_a_short_shared_part_does_not_count() -> None:
    router = Router(RouterConfig(cache_threshold=0.5), capacities=[1000, 1000])
    a = router.route([1, 2, 3, 4, 5, 6, 7, 8], None, 1, UP2)
    b = router.route([1, 2, 3, 9, 9, 9, 9, 9], None, 1, UP2)  # 3 of 8 shared: under the threshold
    assert b.decision is Decision.LEAST_LOADED and b.replica != a.replica


def test_too_much_load_on_the_prefix_replica_goes_to_the_least_loaded() -> None:
    router = Router(RouterConfig(balance_abs=3, balance_rel=1.5), capacities=[10_000, 10_000])
    first = router.route(_ask(0), None, 1, UP2)
    decisions = [router.route(_ask(i), None, 1, UP2) for i in range(1, 8)]
    # the prefix replica takes requests until it leads by more than 3 (and 1.5x): 4 in flight to 0
    assert [p.decision for p in decisions[:3]] == [Decision.PREFIX] * 3
    assert decisions[3].decision is Decision.BALANCED and decisions[3].replica != first.replica
    assert router.stats().decisions_balanced >= 1


def test_finished_requests_free_their_load_and_confirm_their_tokens() -> None:
    router = Router(RouterConfig(), capacities=[10_000, 10_000])
    p = router.route(_ask(1), None, 2, UP2)
    assert router.load[p.replica] == 2
    router.finished(p, _ask(1) + [7, 7, 7], cached=0)
    assert router.load[p.replica] == 0
    again = router.route(_ask(1) + [7, 7, 7, 8], None, 1, UP2)
    assert again.replica == p.replica and again.found.confirmed == len(_ask(1)) + 3
    router.finished(again, None, None)  # aborted: nothing learnt, load freed
    assert router.load == [0, 0]


def test_fewer_cached_tokens_than_promised_forget_the_stale_part() -> None:
    router = Router(RouterConfig(), capacities=[10_000, 10_000])
    old = router.route(list(range(1, 41)), None, 1, [True, False])
    router.finished(old, list(range(1, 41)), cached=0)
    p = router.route(_ask(1), None, 1, [True, False])
    router.finished(p, _ask(1), cached=0)
    q = router.route(_ask(2), None, 1, [True, False])
    assert q.found.confirmed == len(PREFIX)
    router.finished(q, _ask(2), cached=10)  # the replica had evicted most of the prefix
    s = router.stats()
    # The older prompt went with it, and the earlier question's own tail (a leaf under the
    # prefix: the replica evicts leaves first); the prefix itself is back (this request's).
    assert s.index_forgotten_tokens == 40 + 2
    assert router.route(list(range(1, 41)), None, 1, [True, False]).found.length == 0


def test_round_robin_and_least_loaded_skip_failed_replicas() -> None:
    rr = Router(RouterConfig(policy="round_robin"), capacities=[10, 10, 10])
    assert [rr.route([1], None, 1, [True, True, True]).replica for _ in range(4)] == [0, 1, 2, 0]
    assert [rr.route([1], None, 1, [True, False, True]).replica for _ in range(3)] == [2, 0, 2]
    assert rr.stats().decisions_round_robin == 7
    ll = Router(RouterConfig(policy="least_loaded"), capacities=[10, 10])
    assert [ll.route([1], None, 1, [False, True]).replica for _ in range(2)] == [1, 1]
    with pytest.raises(EngineDeadError, match="every replica"):
        ll.route([1], None, 1, [False, False])


def test_config_is_checked() -> None:
    for bad in (
        dict(policy="random"),
        dict(cache_threshold=1.5),
        dict(balance_abs=-1),
        dict(balance_rel=0.5),
        dict(index_tokens=0),
    ):
        with pytest.raises(ValueError, match=f"RouterConfig.{next(iter(bad))}"):
            RouterConfig(**bad)  # type: ignore[arg-type]
