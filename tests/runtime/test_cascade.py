"""Shared-prefix (cascade) decode attention equals plain attention on random inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.cascade import CascadeGroups, cascade_indices, gather_segments
from radixserve.runtime.forward_batch import ForwardBatch

sys.path.insert(0, str(Path(__file__).parent))
from attention_cases import CASCADE_CASES as CASES  # noqa: E402
from attention_cases import shared_batch  # noqa: E402


@pytest.mark.parametrize("name", list(CASES))
def test_cascade_equals_plain_attention(name: str) -> None:
    torch.manual_seed(0)
    groups, suffix, (hq, hkv), d = CASES[name]
    fb, slots = shared_batch(groups, suffix)
    pool = KVPool(KVPoolConfig(2, hkv, d, dtype=torch.float32, device="cpu"), slots)
    for layer in range(2):
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    cascade = TorchAttention(pool, hq, hkv, d, d**-0.5)
    plain = TorchAttention(pool, hq, hkv, d, d**-0.5)
    plain_fb = ForwardBatch(**{**fb.__dict__, "cascade": None})
    cascade.plan(fb)
    plain.plan(plain_fb)
    assert cascade._cascade is not None and plain._cascade is None
    for layer in range(2):
        q = torch.randn(fb.batch_size, hq, d)
        k = torch.randn(fb.batch_size, hkv, d)
        v = torch.randn(fb.batch_size, hkv, d)
        out = cascade.forward(q, k, v, layer, fb)
        ref = plain.forward(q, k, v, layer, plain_fb)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_levels_cut_from_kv_indices() -> None:
    fb, _ = shared_batch([([1, 3], 5)], [2, 1, 3, 4])
    groups = fb.cascade
    assert groups is not None
    idx = cascade_indices(fb.kv_indices, fb.seq_lens, groups)
    ctx = [fb.kv_indices[fb.kv_indptr[i] : fb.kv_indptr[i + 1]] for i in range(4)]
    assert torch.equal(idx.prefix_indices, ctx[1][:5]) and torch.equal(ctx[1][:5], ctx[3][:5])
    want = torch.cat([ctx[0], ctx[1][5:], ctx[2], ctx[3][5:]])
    assert torch.equal(idx.suffix_indices, want)
    assert idx.suffix_lens == [2, 1, 3, 4] and idx.group_sizes == [2]
    assert idx.grouped_rows is not None and idx.grouped_rows.tolist() == [1, 3]
    assert groups.kv_tokens_read(fb.seq_lens) == sum(fb.seq_lens) - 5
    src = torch.arange(10)
    assert gather_segments(src, [7, 0, 3], [2, 0, 3]).tolist() == [7, 8, 3, 4, 5]


def test_groups_are_checked() -> None:
    with pytest.raises(ValueError):
        CascadeGroups(((0,),), (4,))  # a group of one row
    with pytest.raises(ValueError):
        CascadeGroups(((0, 1), (1, 2)), (4, 4))  # a row in two groups
    fb, _ = shared_batch([([0, 1], 3)], [1, 1])
    with pytest.raises(ValueError):  # a prefix that covers a row's whole context
        cascade_indices(fb.kv_indices, fb.seq_lens, CascadeGroups(((0, 1),), (4,)))


@pytest.mark.parametrize("seed", range(6))
def test_cascade_items_cover_each_group_block_and_prefix_key_once(seed: int) -> None:
    """The Triton cascade's work list (cascade_items.py): every (query block, prefix key) of
    every group in exactly one item, keys inside the group's prefix, a partial slot per split,
    and `pack` placing it in a graph's fixed buffer with empty items after it."""
    import numpy as np

    from radixserve.runtime.attention import cascade_items as ci

    rng = np.random.default_rng(seed)
    b = int(rng.integers(4, 40))
    perm = rng.permutation(b).tolist()
    rows, plens, at = [], [], 0
    while at + 2 <= b and len(rows) < 5:
        n = int(rng.integers(2, min(12, b - at) + 1))
        rows.append(tuple(sorted(perm[at : at + n])))
        plens.append(int(rng.integers(1, 1500)))
        at += n
    groups = CascadeGroups(tuple(rows), tuple(plens))
    starts = np.cumsum(rng.integers(1, 2000, size=b)) - 1
    gqa, block_m = int(rng.choice([1, 4, 7])), 16
    work = ci.cascade_items(
        groups, starts, gqa, block_m, target_items=int(rng.integers(1, 300)), max_splits=16
    )
    assert work.skip.tolist() == groups.row_prefix(b)
    assert work.group_rows.tolist() == groups.grouped_rows
    items = work.items
    row0 = np.concatenate(([0], np.cumsum([len(g) for g in rows])[:-1]))
    for g, (members, p) in enumerate(zip(rows, plens)):
        mine = items[:, items[ci.ROW0] == row0[g]]
        assert (mine[ci.TILE] == len(members) * gqa).all()
        base = starts[members[0]]
        blocks = -(-len(members) * gqa // block_m)
        for blk in range(blocks):
            cover = np.zeros(p, dtype=np.int64)
            part = mine[:, mine[ci.BLOCK] == blk]
            for lo, hi in zip(part[ci.KEY_LO], part[ci.KEY_HI]):
                assert base <= lo < hi <= base + p
                cover[lo - base : hi - base] += 1
            assert (cover == 1).all(), (g, blk)
            assert sorted(part[ci.SPLIT].tolist()) == list(range(part.shape[1]))
            assert (
                part.shape[1] == 1 or p // part.shape[1] >= ci.MIN_KEYS_PER_SPLIT
            )  # splits of >= 128 on average
        assert set(mine[ci.BLOCK].tolist()) == set(range(blocks))
    assert work.splits == max(1, int(items[ci.SPLIT].max()) + 1) <= 16
    cap_items = work.num_items + 5
    out = np.full(ci.packed_size(b + 2, cap_items), -7, dtype=np.int32)
    ci.pack(work, b + 2, cap_items, out)
    assert out[:b].tolist() == work.skip.tolist() and out[b : b + 2].tolist() == [0, 0]
    packed_items = out[2 * (b + 2) :].reshape(ci.FIELDS, cap_items)
    assert (packed_items[:, : work.num_items] == items).all() and (
        packed_items[:, work.num_items :] == 0
    ).all()
    with pytest.raises(ValueError):
        ci.pack(work, b, work.num_items - 1, np.zeros(ci.packed_size(b, work.num_items - 1), dtype=np.int32))
