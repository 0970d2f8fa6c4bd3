"""Extend steps replayed from CUDA graphs (runtime/extend_graphs.py) give the eager step's
logits and K/V, for mixed batches of decode rows and prefill chunks (GPU only)."""

from __future__ import annotations

import pytest
import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.model.loader import load_model
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.extend_graphs import ExtendGraphs
from radixserve.runtime.forward_batch import ForwardBatch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLOTS, MAX_ROWS = 16384, 8


# Float32 (Triton only): the same arithmetic up to kernel rounding. bf16 through 24 layers
# of random weights: rounding grows to a few percent, so there the bound is looser (wrong
# rows or a stale buffer would be off by order one).
@pytest.mark.parametrize(
    ("backend", "dtype", "tol"), [("triton", torch.float32, 5e-3), ("flashinfer", torch.bfloat16, 8e-2)]
)
def test_extend_graph_matches_eager(backend: str, dtype: torch.dtype, tol: float) -> None:
    pytest.importorskip("triton")
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    loaded = load_model("dummy:qwen2.5-0.5b", dtype=dtype, device="cuda")
    cfg, model = loaded.config, loaded.model
    device = torch.device("cuda")
    pools, attns = [], []
    for _ in range(2):  # eager, graph: the same random cache on both sides
        pool = KVPool(cfg.kv_pool_config(dtype, device), SLOTS + 1)
        for layer in range(cfg.num_layers):
            gen = torch.Generator(device="cuda").manual_seed(layer)
            pool.k[layer].normal_(generator=gen)
            pool.v[layer].normal_(generator=gen)
        pools.append(pool)
        attns.append(
            make_attention_backend(
                backend, pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attn_scale
            )
        )
    graphs = ExtendGraphs(model, attns[1], MAX_ROWS, 512, MAX_ROWS * 2048, SLOTS, device)
    stream = torch.cuda.Stream()
    graphs.capture(stream)
    perm = torch.randperm(SLOTS)
    # Decode rows first, then chunks with and without a cached prefix; two shapes in a row,
    # the second smaller (its buckets' padding holds the first step's stale rows).
    steps = [([300, 41, 700, 0, 129, 17], [1, 1, 1, 190, 64, 33]), ([900, 5, 0], [1, 1, 70])]
    start = 0
    for prefix, extend in steps:
        seq = [p + e for p, e in zip(prefix, extend)]
        slots = []
        for n in seq:
            slots.append(perm[start : start + n])
            start += n
        ids = torch.randint(0, cfg.vocab_size, (sum(extend),))
        fb = ForwardBatch.build(ids, extend, prefix, slots, device=device)
        outs = []
        with torch.cuda.stream(stream), torch.inference_mode():
            attns[0].plan(fb)
            outs.append(model(fb, attns[0]).float())
            assert graphs.can_run(fb)
            outs.append(graphs.run(fb).float().clone())
        stream.synchronize()
        assert outs[1].shape == (len(extend), cfg.vocab_size)
        # Different attention kernels (the eager step's against the graph's decode + tiled
        # extend) and GEMM shapes (padded rows): equal up to rounding.
        err = float((outs[1] - outs[0]).norm() / outs[0].norm())
        assert err < tol, err
        written = torch.cat([s[len(s) - e :] for s, e in zip(slots, extend)]).cuda()
        for layer in (0, cfg.num_layers - 1):
            got, want = pools[1].k[layer][written].float(), pools[0].k[layer][written].float()
            assert float((got - want).norm() / want.norm()) < tol
        # Padding tokens wrote only the scratch slot: every other slot is as before.
        untouched = perm[start:].cuda()
        assert torch.equal(pools[1].k[0][untouched], pools[0].k[0][untouched])
