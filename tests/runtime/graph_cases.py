"""One side of the GPU graph tests (test_graph_inputs.py, test_cascade_graphs.py): what a
graph replay and its eager or host-built counterpart each run on."""

from __future__ import annotations

from typing import Any

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.runtime.attention import make_attention_backend


def graph_side(cfg: Any, max_bs: int, context: int, slots: int) -> tuple[KVPool, ReqToSlotTable, Any]:
    """A bf16 pool of `slots` + 1 (the scratch slot) with the same seeded random K/V on every
    call, a request table with all `max_bs` rows in use (rows are written only once allocated),
    and the FlashInfer backend over the pool (Triton decode, its default)."""
    device = torch.device("cuda")
    pool = KVPool(cfg.kv_pool_config(torch.bfloat16, device), slots + 1)
    for layer in range(cfg.num_layers):
        gen = torch.Generator(device="cuda").manual_seed(layer)
        pool.k[layer].normal_(generator=gen)
        pool.v[layer].normal_(generator=gen)
    table = ReqToSlotTable(max_bs, context, device=device)
    for _ in range(max_bs):
        table.alloc_row()
    attn = make_attention_backend(
        "flashinfer", pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attn_scale
    )
    return pool, table, attn
