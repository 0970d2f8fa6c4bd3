"""Attention backends behind one interface; GPU ones import their libraries lazily."""

from __future__ import annotations

import importlib.util
import os

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention.base import AttentionBackend, AttentionOptions
from radixserve.runtime.attention.torch_backend import TorchAttention

__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionOptions",
    "TorchAttention",
    "make_attention_backend",
]

BACKEND_NAMES = ("auto", "flashinfer", "triton", "torch")


def _flashinfer_importable() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:  # a broken install (missing CUDA libs) counts as absent
        return False
    return True


def _check_triton(pool: KVPool) -> None:
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("the triton attention backend needs the triton package (pip install triton)")
    on_gpu = torch.device(pool.config.device).type == "cuda"
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"the triton attention backend needs a CUDA KV pool (got device {pool.config.device}); "
            "on the CPU it runs only under TRITON_INTERPRET=1, for tests"
        )


def make_attention_backend(
    name: str,
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    decode_kernel: str = "auto",
    options: AttentionOptions | None = None,
) -> AttentionBackend:
    """Build the attention backend `name` for `pool`.

    "auto" takes FlashInfer when it imports and the pool is a float16/bfloat16
    pool on CUDA, else Triton on a GPU, else the torch reference. Asking for a
    backend that cannot run here raises with the reason. `decode_kernel` picks the
    FlashInfer backend's decode kernel (see `flashinfer_attention`). `options`: the
    model's windows and soft-cap; a backend without soft-capping refuses a soft-capped
    model, one without windows ignores them (the engine caps the context instead).
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    args = (pool, num_heads, num_kv_heads, head_dim, scale)
    on_gpu = torch.device(pool.config.device).type == "cuda"
    if name == "auto":
        if on_gpu and pool.config.dtype in (torch.float16, torch.bfloat16) and _flashinfer_importable():
            name = "flashinfer"
        elif on_gpu and importlib.util.find_spec("triton") is not None:
            name = "triton"
        else:
            name = "torch"
    if name == "torch":
        return TorchAttention(*args, options=options)
    softcap = options.logit_softcap if options is not None else None
    if softcap is not None:
        raise ValueError(
            f"attn_logit_softcapping={softcap}: the {name} attention backend has no logit soft-capping "
            "yet; attention_backend='torch' computes it"
        )
    if name == "triton":
        _check_triton(pool)
        from radixserve.runtime.attention.triton_backend import TritonAttention

        return TritonAttention(*args)
    from radixserve.runtime.attention.flashinfer_backend import flashinfer_attention
    from radixserve.runtime.attention.flashinfer_plans import import_flashinfer

    try:
        import_flashinfer()
    except ImportError as e:
        raise RuntimeError(str(e)) from e
    return flashinfer_attention(*args, decode_kernel=decode_kernel)
