"""Which K/V writer a GPU backend uses: the one-launch Triton kernel when triton
is installed (runtime/attention/kv_store.py says why), else `KVPool.write`."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from radixserve.cache.kv_pool import KVPool

KVWriter = Callable[[KVPool, int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def _pool_write(pool: KVPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    pool.write(layer, slots, k, v)


def pool_writer(pool: KVPool) -> KVWriter:
    if torch.device(pool.config.device).type != "cuda" or importlib.util.find_spec("triton") is None:
        return _pool_write
    from radixserve.runtime.attention.kv_store import store_kv  # imports triton

    return store_kv
