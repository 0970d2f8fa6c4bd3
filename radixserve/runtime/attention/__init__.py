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
# The head sizes FlashInfer's attention modules are built and tested for. Its just-in-time
# build compiles others, but the extend kernel at head_dim 16 crashed the process on an H100
# (flashinfer 0.3.1), so other sizes take Triton under "auto" and are refused by name.
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def _flashinfer_importable() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:  # a broken install (missing CUDA libs) counts as absent
        return False
    return True


def _check_triton(pool: KVPool, name: str = "triton") -> None:
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError(f"the {name} attention backend needs the triton package (pip install triton)")
    on_gpu = torch.device(pool.config.device).type == "cuda"
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"the {name} attention backend needs a CUDA KV pool (got device {pool.config.device}); "
            "on the CPU its Triton kernels run only under TRITON_INTERPRET=1, for tests"
        )


def _triton_hybrid(
    pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, options: AttentionOptions
) -> AttentionBackend:
    """ "flashinfer" for a model with windows or a soft-cap (our FlashInfer wrappers are given
    no `window_left` / `logits_soft_cap`), and "auto" for a head size FlashInfer is not built
    for: both halves Triton's; the decode half keeps its CUDA graphs (`TritonDecodeAttention`)."""
    from radixserve.runtime.attention.hybrid import HybridAttention
    from radixserve.runtime.attention.triton_backend import TritonAttention
    from radixserve.runtime.attention.triton_decode_backend import TritonDecodeAttention

    args = (pool, num_heads, num_kv_heads, head_dim, scale)
    extend = TritonAttention(*args, options=options)
    return HybridAttention("triton-hybrid", extend, TritonDecodeAttention(*args, options=options))


def make_attention_backend(
    name: str,
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    decode_kernel: str = "auto",
    options: AttentionOptions | None = None,
    deterministic: bool = False,
) -> AttentionBackend:
    """Build the attention backend `name` for `pool`.

    "auto" takes FlashInfer when it imports, the pool is a float16/bfloat16 pool
    on CUDA and the head size one of `FLASHINFER_HEAD_DIMS`, else Triton on a GPU (for a
    float16/bfloat16 pool its extend kernel beside the graph-captured decode backend,
    `_triton_hybrid`), else the torch reference. Asking for a backend that cannot run here
    raises with the reason. `decode_kernel` picks the FlashInfer backend's decode kernel (see
    `flashinfer_attention`). `options`: the model's windows and soft-cap. "torch" and
    "triton" compute both; "flashinfer" then runs Triton's kernels for both halves
    (`_triton_hybrid`), unless `decode_kernel` is "flashinfer" (or triton is missing): that
    keeps FlashInfer's kernels, which refuse a soft-capped model and ignore windows (the
    engine caps the context instead).
    `deterministic`: the batch-invariant backends (`invariant_backend`).
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    args = (pool, num_heads, num_kv_heads, head_dim, scale)
    on_gpu = torch.device(pool.config.device).type == "cuda"
    if deterministic:
        return invariant_backend(name, *args, options)
    options = options or AttentionOptions()
    if name == "auto":
        half = pool.config.attn_dtype in (torch.float16, torch.bfloat16)
        if not on_gpu:
            name = "torch"
        elif half and head_dim in FLASHINFER_HEAD_DIMS and _flashinfer_importable():
            name = "flashinfer"
        elif importlib.util.find_spec("triton") is None:
            name = "torch"
        elif half:  # Triton's extend with its graph-captured decode, as "flashinfer" pairs them
            return _triton_hybrid(*args, options)
        else:
            name = "triton"
    if name == "torch":
        return TorchAttention(*args, options=options)
    if name == "triton":
        _check_triton(pool)
        from radixserve.runtime.attention.triton_backend import TritonAttention

        return TritonAttention(*args, options=options)
    if not options.plain and decode_kernel != "flashinfer" and importlib.util.find_spec("triton") is not None:
        _check_triton(pool, name)
        return _triton_hybrid(*args, options)
    if options.logit_softcap is not None:
        raise ValueError(
            f"attn_logit_softcapping={options.logit_softcap}: FlashInfer's kernels here have no logit "
            "soft-capping (decode_kernel='flashinfer', or triton missing); attention_backend 'triton' "
            "or 'torch', or decode_kernel 'auto' / 'triton' compute it"
        )
    if head_dim not in FLASHINFER_HEAD_DIMS:
        raise ValueError(
            f"head_dim={head_dim}: the flashinfer attention backend runs head sizes "
            f"{', '.join(map(str, FLASHINFER_HEAD_DIMS))}; attention_backend 'triton' runs any"
        )
    from radixserve.runtime.attention.flashinfer_backend import flashinfer_attention
    from radixserve.runtime.attention.flashinfer_plans import import_flashinfer

    try:
        import_flashinfer()
    except ImportError as e:
        raise RuntimeError(str(e)) from e
    return flashinfer_attention(*args, decode_kernel=decode_kernel)


def invariant_backend(
    name: str,
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    options: AttentionOptions | None,
) -> AttentionBackend:
    """The batch-invariant backend for `name`: "torch" (the CPU's), "triton" (CUDA's; "auto"
    picks it where a CUDA pool and triton are there, else "torch"). FlashInfer has none: its
    prefill attends the cached prefix and the new tokens as two parts merged by their
    log-sum-exp, a sum order that moves with every chunk boundary (docs/deterministic.md)."""
    args = (pool, num_heads, num_kv_heads, head_dim, scale)
    if name == "flashinfer":
        raise ValueError("deterministic mode has no FlashInfer backend; use 'auto', 'triton' or 'torch'")
    on_gpu = torch.device(pool.config.device).type == "cuda"
    if name == "auto":
        name = "triton" if on_gpu and importlib.util.find_spec("triton") is not None else "torch"
    if name == "torch":
        from radixserve.runtime.attention.torch_invariant import InvariantTorchAttention

        return InvariantTorchAttention(*args, options=options)
    _check_triton(pool)
    from radixserve.runtime.attention.triton_invariant import InvariantTritonAttention

    return InvariantTritonAttention(*args, options=options)
