"""The batch sizes decode graphs are captured for: every batch up to the cap replays a graph
padded by at most half its rows (the ladder's gaps), under 128 rows past 512 (not up to the cap),
and the default cap keeps its ladder."""

from __future__ import annotations

import pytest

from radixserve.runtime.cuda_graph import GRAPH_LADDER, WIDE_STEP, graph_batch_sizes


@pytest.mark.parametrize("max_bs", [1, 5, 256, 300, 512, 513, 1000, 1024, 4096])
def test_every_batch_has_a_graph_near_its_size(max_bs: int) -> None:
    sizes = graph_batch_sizes(max_bs)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_bs
    for b in range(1, max_bs + 1):
        padded = next(s for s in sizes if s >= b)
        assert padded - b <= max(3, b // 2), (b, padded)
        if b > GRAPH_LADDER[-1]:
            assert padded - b < WIDE_STEP, (b, padded)


def test_default_cap_keeps_the_ladder_and_wide_caps_step_by_128() -> None:
    assert graph_batch_sizes(256) == [b for b in GRAPH_LADDER if b <= 256]
    assert graph_batch_sizes(512) == list(GRAPH_LADDER)
    assert graph_batch_sizes(1024)[-5:] == [512, 640, 768, 896, 1024]
    assert graph_batch_sizes(1000)[-4:] == [640, 768, 896, 1000]
