"""Shared cases for the attention backend tests: random batches over a KV pool
and the relative error of a backend against the torch reference.

`run_triton_cpu_cases` runs the Triton backend on the CPU over `CPU_CASES`
under TRITON_INTERPRET=1; the tests run it in a subprocess (interpreted_cases.py)
so that the interpreter flag (read when triton kernels are defined) never
reaches the test process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.attention.base import AttentionBackend, AttentionOptions
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch, GraphAttention


@dataclass(frozen=True)
class Case:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    num_layers: int = 2
    decode_splits: int | None = None  # Triton only: force the split-K factor

    @property
    def is_decode(self) -> bool:
        return all(e == 1 for e in self.extend_lens)


# Small enough for the interpreter; each crosses the kernels' tile edges
# (16 on the CPU): prefixes and extends that are not multiples of 16, an
# empty prefix, decodes inside an extend batch, empty decode splits.
CPU_CASES = [
    Case("mixed_gqa4_d64", 8, 2, 64, (0, 23, 40, 0, 7), (19, 5, 1, 1, 33)),
    Case("mixed_mha_d128", 2, 2, 128, (17, 0, 3), (1, 20, 16)),
    Case("mixed_gqa3_d96", 6, 2, 96, (31, 1), (9, 2)),
    Case("decode_gqa4_d128", 8, 2, 128, (0, 70, 33, 5), (1, 1, 1, 1)),
    Case("decode_split3_d64", 8, 2, 64, (0, 70, 33, 5), (1, 1, 1, 1), decode_splits=3),
    # 5 splits over contexts of 1 and 2 tokens leaves most splits empty.
    Case("decode_split5_short", 4, 1, 64, (0, 1, 50), (1, 1, 1), decode_splits=5),
    Case("mixed_fp16_d64", 8, 2, 64, (9, 0), (12, 1), dtype=torch.float16),
    Case("decode_fp16_split2", 8, 2, 64, (40, 3), (1, 1), dtype=torch.float16, decode_splits=2),
]


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


CASCADE_CASES = {
    # groups (rows, prefix), per-row own slots, heads (q, kv), head dim
    "two_groups_and_singletons": ([([0, 1, 2], 37), ([4, 5], 20)], [1, 5, 9, 13, 2, 1, 30], (8, 2), 64),
    "interleaved_rows": ([([0, 2, 5], 50), ([1, 4], 3)], [4, 1, 7, 40, 2, 1], (4, 4), 32),
    "one_group_all_rows": ([([0, 1, 2, 3], 64)], [1, 2, 3, 4], (6, 2), 16),
    # Long enough for several prefix splits (at least 128 keys each) when the GPU is large.
    "long_prefix": ([([0, 1, 3], 300)], [1, 3, 2, 5], (8, 2), 64),
}


def make_pool_and_batch(case: Case, device: str, num_slots: int | None = None) -> tuple[KVPool, ForwardBatch]:
    """A pool filled with random K/V and a batch whose requests own random,
    scattered slots (so slot order never matches position order)."""
    seq = [p + e for p, e in zip(case.prefix_lens, case.extend_lens, strict=True)]
    num_slots = num_slots or 2 * sum(seq) + 8
    pool = KVPool(
        KVPoolConfig(case.num_layers, case.num_kv_heads, case.head_dim, dtype=case.dtype, device=device),
        num_slots,
    )
    for layer in range(case.num_layers):
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    perm = torch.randperm(num_slots)
    starts = [0]
    for n in seq:
        starts.append(starts[-1] + n)
    slots = [perm[a:b] for a, b in zip(starts, starts[1:], strict=False)]
    ids = torch.zeros(sum(case.extend_lens), dtype=torch.int64)
    batch = ForwardBatch.build(ids, list(case.extend_lens), list(case.prefix_lens), slots, device=device)
    return pool, batch


def clone_pool(pool: KVPool) -> KVPool:
    other = KVPool(pool.config, pool.num_slots)
    for layer in range(pool.config.num_layers):
        other.k[layer].copy_(pool.k[layer])
        other.v[layer].copy_(pool.v[layer])
    return other


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN anywhere gives NaN (fails any bound)."""
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm())


def compare(
    case: Case,
    backend: AttentionBackend,
    ref_pool: KVPool,
    batch: ForwardBatch,
    options: AttentionOptions | None = None,
    planned: bool = False,
) -> dict[str, float]:
    """Run every layer through `backend` (on its pool) and the float32 torch
    reference (on `ref_pool`, a copy of the same starting pool; with the model's
    windows and soft-cap `options`), with fresh q/k/v per layer. `planned`: the
    backend was planned for `batch` already (a graph state). Returns the worst
    output error and pool error."""
    scale = case.head_dim**-0.5
    device = ref_pool.config.device
    cfg = KVPoolConfig(case.num_layers, case.num_kv_heads, case.head_dim, torch.float32, device)
    ref32 = KVPool(cfg, ref_pool.num_slots)
    for layer in range(case.num_layers):
        ref32.k[layer].copy_(ref_pool.k[layer])
        ref32.v[layer].copy_(ref_pool.v[layer])
    ref = TorchAttention(ref32, case.num_heads, case.num_kv_heads, case.head_dim, scale, options=options)
    if not planned:
        backend.plan(batch)
    ref.plan(batch)
    device = batch.kv_indices.device
    worst = {"out": 0.0, "pool": 0.0}
    tokens = batch.num_tokens
    for layer in range(case.num_layers):
        q = torch.randn(tokens, case.num_heads, case.head_dim, device=device).to(case.dtype)
        k = torch.randn(tokens, case.num_kv_heads, case.head_dim, device=device).to(case.dtype)
        v = torch.randn(tokens, case.num_kv_heads, case.head_dim, device=device).to(case.dtype)
        out = backend.forward(q, k, v, layer, batch)
        expect = ref.forward(q.float(), k.float(), v.float(), layer, batch)
        assert out.shape == q.shape and out.dtype == q.dtype
        worst["out"] = max(worst["out"], rel_err(out, expect))
        pool_err = max(
            rel_err(backend.pool.k[layer], ref32.k[layer]), rel_err(backend.pool.v[layer], ref32.v[layer])
        )
        worst["pool"] = max(worst["pool"], pool_err)
    return worst


def graph_inputs(batch: ForwardBatch) -> GraphAttention:
    """`ForwardBatch.graph` as runtime/extend_graphs.py fills it, for a graph of as many rows."""
    from radixserve.runtime.attention.triton_extend import GRAPH_BLOCK_M, extend_tiles
    from radixserve.runtime.attention.triton_kernels import DecodeTiling

    lens = batch.extend_lens
    n_dec = next((i for i, e in enumerate(lens) if e != 1), len(lens))
    d = min(len(lens), batch.num_tokens)
    cap = sum(-(-e // GRAPH_BLOCK_M) for e in lens) + 3
    tiles = torch.from_numpy(extend_tiles(lens, GRAPH_BLOCK_M, cap, n_dec))
    indptr = batch.kv_indptr[: d + 1].clone()
    indptr[n_dec + 1 :] = indptr[n_dec]
    return GraphAttention(tiles, indptr, DecodeTiling(2, 16))


def run_triton_cpu_cases() -> dict[str, dict[str, float]]:
    """Every case through the Triton backend; extend cases also as graph-captured steps
    run them (the tile table, `<name>_tiled`)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    results: dict[str, dict[str, float]] = {}
    for case in CPU_CASES:
        pool, batch = make_pool_and_batch(case, "cpu")
        ref_pool = clone_pool(pool)
        backend = make_attention_backend(
            "triton", pool, case.num_heads, case.num_kv_heads, case.head_dim, case.head_dim**-0.5
        )
        assert backend.name == "triton"
        backend.decode_splits = case.decode_splits  # type: ignore[attr-defined]
        results[case.name] = compare(case, backend, ref_pool, batch)
        if not case.is_decode:  # again as a graph-replayed step runs it (padded tile table)
            pool, batch = make_pool_and_batch(case, "cpu")
            ref_pool = clone_pool(pool)
            batch.graph = graph_inputs(batch)
            backend.pool = pool
            results[case.name + "_tiled"] = compare(case, backend, ref_pool, batch)
    return results


def run_triton_cascade_cases() -> dict[str, dict[str, float]]:
    """The Triton backend's cascade steps against the torch reference, on a "GPU" of 64 SMs
    (the SM count sets the prefix splits)."""
    from dataclasses import replace

    results: dict[str, dict[str, float]] = {}
    for name, (groups, suffix, (hq, hkv), d) in CASCADE_CASES.items():
        fb, slots = shared_batch(groups, suffix)
        case = Case(name, hq, hkv, d, tuple(fb.prefix_lens), tuple(fb.extend_lens))
        pool = KVPool(KVPoolConfig(case.num_layers, hkv, d, dtype=torch.float32), slots)
        for layer in range(case.num_layers):
            pool.k[layer].normal_()
            pool.v[layer].normal_()
        backend = make_attention_backend("triton", pool, hq, hkv, d, d**-0.5)
        shape = backend._cascade_shape  # type: ignore[attr-defined]
        backend._cascade_shape = replace(shape, num_sms=64)  # type: ignore[attr-defined]
        got = compare(case, backend, clone_pool(pool), fb)
        got["prefix_splits"] = backend._cascade.prefix_splits  # type: ignore[attr-defined]
        results[name] = got
    return results


def run_triton_cascade_graph_cases() -> dict[str, dict[str, float]]:
    """A cascade CUDA-graph state's kernels (triton_cascade_graph.py) without the graph: a state
    of a few rows more than the step (padding rows, one scratch slot each, as `step_fill` lays
    them out), its work list uploaded as before a replay, and partial buffers that start as
    garbage (a replayed graph reuses its memory), against the torch reference; then a second
    step on the same state with the first group gone (its stale slots must not count)."""
    import numpy as np

    from radixserve.runtime.attention import triton_kernels as tk
    from radixserve.runtime.attention.triton_cascade import CascadeShape
    from radixserve.runtime.attention.triton_cascade_graph import CascadeStaging, TritonCascadeGraphState
    from radixserve.runtime.attention.triton_decode import TritonDecodeGraphState

    new_partials = tk.new_partials

    def garbage_partials(q: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        o, lse = new_partials(q, n)
        return o.fill_(1e4), lse.fill_(50.0)

    tk.new_partials = garbage_partials  # type: ignore[assignment]
    results: dict[str, dict[str, float]] = {}
    try:
        for name, (groups, suffix, (hq, hkv), d) in CASCADE_CASES.items():
            fb, slots = shared_batch(groups, suffix)
            b, pad = fb.batch_size, 3
            scratch = slots  # one slot past the batch's: the padding rows' one key
            pool = KVPool(KVPoolConfig(2, hkv, d, dtype=torch.float32), slots + 1)
            for layer in range(2):
                pool.k[layer].normal_()
                pool.v[layer].normal_()
            indptr = torch.cat([fb.kv_indptr, fb.kv_indptr[-1] + torch.arange(1, pad + 1, dtype=torch.int32)])
            indices = torch.cat([fb.kv_indices, torch.full((pad,), scratch, dtype=torch.int32)])
            shape = CascadeShape(hkv, hq // hkv, d**-0.5, 16, num_sms=64)
            plain = TritonDecodeGraphState(
                b + pad, indices.numel(), tk.DecodeTiling(2, 16), d**-0.5, indptr, indices
            )
            state = TritonCascadeGraphState.make(
                plain, CascadeStaging.for_batch(b + pad, shape, pool.k[0].device), shape
            )
            worst = {"out": 0.0, "out_regrouped": 0.0}
            prefix_lens = np.asarray(fb.seq_lens, dtype=np.int64) - 1
            ref = TorchAttention(pool, hq, hkv, d, d**-0.5)
            ref.plan(ForwardBatch(**{**fb.__dict__, "cascade": None}))
            cascade = fb.cascade
            assert cascade is not None
            steps = [
                ("out", cascade),
                ("out_regrouped", CascadeGroups(cascade.rows[1:], cascade.prefix_lens[1:])),
            ]
            for key, groups_now in steps:
                if not groups_now.rows:
                    continue
                state.upload(groups_now, prefix_lens)
                for layer in range(2):
                    q = torch.randn(b + pad, hq, d)
                    out = state.run(q, (pool.k[layer], pool.v[layer]))[:b]
                    k_new, v_new = pool.k[layer][fb.out_slots], pool.v[layer][fb.out_slots]
                    expect = ref.forward(q[:b], k_new, v_new, layer, fb)
                    worst[key] = max(worst[key], rel_err(out, expect))
            results[name] = worst
    finally:
        tk.new_partials = new_partials  # type: ignore[assignment]
    return results
