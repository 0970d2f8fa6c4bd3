"""Shared-prefix (cascade) decode attention equals plain attention on random inputs."""

from __future__ import annotations

import pytest
import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.cascade import CascadeGroups, cascade_indices, gather_segments
from radixserve.runtime.forward_batch import ForwardBatch


def shared_batch(
    groups: list[tuple[list[int], int]], suffix: list[int], device: str = "cpu"
) -> tuple[ForwardBatch, int]:
    """A decode batch whose grouped rows start with the same (scattered) slots.

    `groups`: (rows, shared prefix length); `suffix[i]`: row i's own slots, the
    token being decoded included. Returns the batch and the slots it needs."""
    b = len(suffix)
    need = sum(p for _, p in groups) + sum(suffix)
    perm = torch.randperm(need + 7)
    take = iter(perm.tolist())
    ctx: list[list[int]] = [[] for _ in range(b)]
    for rows, p in groups:
        shared = [next(take) for _ in range(p)]
        for r in rows:
            ctx[r] = list(shared)
    for r in range(b):
        ctx[r] += [next(take) for _ in range(suffix[r])]
    slots = [torch.tensor(c) for c in ctx]
    seq = [len(c) for c in ctx]
    fb = ForwardBatch.build(torch.zeros(b, dtype=torch.int64), [1] * b, [n - 1 for n in seq], slots, device)
    fb.cascade = CascadeGroups(tuple(tuple(g) for g, _ in groups), tuple(p for _, p in groups))
    return fb, need + 7


CASES = {
    # groups (rows, prefix), per-row own slots, heads (q, kv), head dim
    "two_groups_and_singletons": ([([0, 1, 2], 37), ([4, 5], 20)], [1, 5, 9, 13, 2, 1, 30], (8, 2), 64),
    "interleaved_rows": ([([0, 2, 5], 50), ([1, 4], 3)], [4, 1, 7, 40, 2, 1], (4, 4), 32),
    "one_group_all_rows": ([([0, 1, 2, 3], 64)], [1, 2, 3, 4], (6, 2), 16),
}


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
