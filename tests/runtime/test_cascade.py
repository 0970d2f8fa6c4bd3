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
