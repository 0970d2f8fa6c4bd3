"""Batch-invariance cases of the deterministic attention backends, for the torch backend in
process and the Triton one in the interpreter subprocess (interpreted_cases.py).

One request's 45 tokens are attended three ways: as one prefill, as three chunks each
beside another request's chunk, and one token at a time as a decode row among other
decode rows of other lengths; a backend with decode graphs also a fourth, those decode
rows through a graph state padded by one row (planned as a replay plans it, not
captured). The K/V every way sees are the same pool entries, so a batch-invariant
backend gives each token the same output to the bit; the torch reference (SDPA) bounds
how far that output is from plain attention."""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention.base import AttentionBackend, AttentionOptions
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.forward_batch import ForwardBatch

N, HQ, HKV, D = 45, 6, 2, 32
OTHER = 70  # the other request's length

Make = Callable[[KVPool, AttentionOptions], AttentionBackend]


def _run(backend: AttentionBackend, batch: ForwardBatch, q: torch.Tensor, pool: KVPool) -> torch.Tensor:
    """One layer over `batch` whose new tokens' K/V are those the pool holds already."""
    k, v = pool.k[0][batch.out_slots].clone(), pool.v[0][batch.out_slots].clone()
    backend.plan(batch)
    return backend.forward(q, k, v, 0, batch)


def _decode_rows(mine: torch.Tensor, other: torch.Tensor, p: int) -> list[torch.Tensor]:
    """Step p's decode rows: the request's first p + 1 slots, then two others whose lengths
    change every step."""
    return [mine[: p + 1], other[: 1 + (p * 7) % OTHER], other]


def _graph_decoded(
    backend: AttentionBackend, pool: KVPool, rows: list[torch.Tensor], q: torch.Tensor
) -> torch.Tensor:
    """The 3 decode rows through a graph state of 4, padded as runtime/cuda_graph.py pads (a
    row of one scratch slot), planned by `plan_cuda_graph` instead of `plan`."""
    planner = backend.decode_graphs()
    assert planner is not None
    device = q.device
    state = planner.make_cuda_graph_decode_state(4, N + 2 * OTHER + 1)
    rows = [*rows, torch.tensor([pool.k[0].shape[0] - 1])]  # slot lists stay host lists, as the others
    fb = ForwardBatch.build([0] * len(rows), [1] * len(rows), [len(r) - 1 for r in rows], rows, device)
    k, v = pool.k[0][fb.out_slots].clone(), pool.v[0][fb.out_slots].clone()
    planner.plan_cuda_graph(state, fb)
    return backend.forward(torch.cat((q, q[:1])), k, v, 0, fb)[: len(rows) - 1]


def invariance_case(
    make: Make, options: AttentionOptions, seed: int = 0, device: str = "cpu"
) -> dict[str, float]:
    """Worst difference of the request's outputs between the three ways (must be 0), and
    the prefill's relative error against the torch reference."""
    torch.manual_seed(seed)
    pool = KVPool(KVPoolConfig(1, HKV, D, dtype=torch.float32, device=device), N + OTHER + 8)
    pool.k[0].normal_()
    pool.v[0].normal_()
    perm = torch.randperm(N + OTHER + 8)
    mine, other = perm[:N], perm[N : N + OTHER]
    q_mine, q_other = torch.randn(N, HQ, D, device=device), torch.randn(OTHER, HQ, D, device=device)
    backend = make(pool, options)

    whole = _run(backend, ForwardBatch.build([0] * N, [N], [0], [mine], device), q_mine, pool)
    ref = _run(
        TorchAttention(pool, HQ, HKV, D, D**-0.5, options),
        ForwardBatch.build([0] * N, [N], [0], [mine], device),
        q_mine,
        pool,
    )

    chunked = torch.empty_like(whole)
    for a, b, o in ((0, 13, 20), (13, 30, 35), (30, N, OTHER)):
        fb = ForwardBatch.build([0] * (b - a + 9), [b - a, 9], [a, o - 9], [mine[:b], other[:o]], device)
        chunked[a:b] = _run(backend, fb, torch.cat((q_mine[a:b], q_other[o - 9 : o])), pool)[: b - a]

    graphs = backend.decode_graphs() is not None
    decoded, graph_decoded = torch.empty_like(whole), torch.empty_like(whole)
    for p in range(N):
        rows = _decode_rows(mine, other, p)
        fb = ForwardBatch.build([0] * 3, [1, 1, 1], [len(r) - 1 for r in rows], rows, device)
        q = torch.stack((q_mine[p], q_other[len(rows[1]) - 1], q_other[-1]))
        decoded[p] = _run(backend, fb, q, pool)[0]
        if graphs:
            graph_decoded[p] = _graph_decoded(backend, pool, rows, q)[0]

    err = float((whole.double() - ref.double()).norm() / ref.double().norm())
    res = {
        "chunked_vs_whole": float((chunked - whole).abs().max()),
        "decoded_vs_whole": float((decoded - whole).abs().max()),
        "rel_err_vs_reference": err,
    }
    if graphs:
        res["graph_decoded_vs_whole"] = float((graph_decoded - whole).abs().max())
    return res


def option_cases() -> dict[str, AttentionOptions]:
    return {
        "plain": AttentionOptions(),
        "window_softcap": AttentionOptions(windows=(20,), logit_softcap=30.0),
    }


def run_triton_invariance_cases() -> dict[str, dict[str, float]]:
    """In the interpreter process: the Triton backend over `option_cases`."""
    from radixserve.runtime.attention.triton_invariant import InvariantTritonAttention

    def make(pool: KVPool, options: AttentionOptions) -> AttentionBackend:
        return InvariantTritonAttention(pool, HQ, HKV, D, D**-0.5, options)

    return {name: invariance_case(make, opts) for name, opts in option_cases().items()}


def run_triton_matmul_cases() -> dict[str, float]:
    """In the interpreter process: Triton's linear, row-invariant and close to torch."""
    from radixserve.runtime.triton_matmul import triton_linear

    w, b, x = torch.randn(100, 70) * 0.1, torch.randn(100), torch.randn(130, 70)
    alone = triton_linear(x[:1], w, b)
    worst_row, worst_ref = 0.0, 0.0
    for m in (1, 7, 64, 130):
        y = triton_linear(x[:m], w, b)
        worst_row = max(worst_row, float((y[:1] - alone).abs().max()))
        worst_ref = max(worst_ref, float((y - torch.nn.functional.linear(x[:m], w, b)).abs().max()))
    return {"row_vs_alone": worst_row, "vs_torch": worst_ref}
