"""Which K/V writer a backend uses, and the rotary embedding it applies on the way.

A backend's `forward` takes q and k before rotary (`Rope`) and writes the new tokens'
K/V: on CUDA, or in any Triton backend, with `kv_store.rope_store_kv` (one launch
rotating q and k and storing k and v: kv_store.py says why); elsewhere (the CPU, or
triton missing) with the model's own rope op, then `KVPool.write`, so CPU results
stay transformers' to the bit.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention.rope import Rope

# (pool, layer, slots, positions, q, k, v, rope) -> q: q and k rotated by `positions` (`rope`
# None: they come rotated), k and v stored at `slots` in `layer`; q returned rotated.
KVWriter = Callable[
    [KVPool, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Rope | None],
    torch.Tensor,
]


def write_apart(
    pool: KVPool,
    layer: int,
    slots: torch.Tensor,
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: Rope | None,
) -> torch.Tensor:
    """The model's rope op, then `KVPool.write`."""
    if rope is not None:
        q, k = rope.apply(positions, q, k, rope.cos, rope.sin)
    pool.write(layer, slots, k, v)
    return q


def kv_writer(pool: KVPool, triton_backend: bool = False) -> KVWriter:
    """`rope_store_kv` for a Triton backend (the interpreter runs it on the CPU) or a CUDA pool
    with triton installed; `write_apart` otherwise."""
    on_cuda = torch.device(pool.config.device).type == "cuda"
    if not (triton_backend or on_cuda) or importlib.util.find_spec("triton") is None:
        return write_apart
    from radixserve.runtime.attention.kv_store import rope_store_kv  # imports triton

    return rope_store_kv
