"""The "flashinfer" backend: FlashInfer's paged kernels (page size 1, NHD layout) for extend
steps, and for decode steps our Triton split-K kernel or FlashInfer's decode wrapper, composed
as a `HybridAttention` (hybrid.py).

The pool's per-layer `[num_slots, Hkv, D]` buffers are FlashInfer's paged cache with one token
per page (`view(-1, 1, Hkv, D)`), and `kv_indptr` / `kv_indices` are its page table as they
stand, so nothing is converted. One float workspace serves every wrapper (they run one after
another on one stream): `FlashInferPlanner` (flashinfer_plans.py) holds it for both halves.

- Extend steps: `FlashInferExtend` (flashinfer_extend.py).
- Decode steps: `TritonDecodeAttention` (triton_decode_backend.py) with `decode_kernel="triton"`,
  or "auto" where triton is installed; `FlashInferDecode` (flashinfer_decode.py) with
  `decode_kernel="flashinfer"`. Each brings its own cascade steps and CUDA-graph states.

An FP8 pool (`kv_cache_dtype="fp8_e4m3"`) is planned with `kv_data_type` float8_e4m3fn and
`q_data_type` the model's; each layer's run takes its `k_scale` (FlashInfer folds it into the
softmax scale, so a cascade level's log-sum-exp carries it) and `v_scale` (an in-place multiply
of the output, captured in graphs like the rest): `FlashInferPlanner.run_scales`.

Our wrappers are given no `window_left` / `logits_soft_cap`: for a model with windows or a
soft-cap, "flashinfer" builds Triton's halves instead (`_triton_hybrid` in __init__.py) unless
`decode_kernel="flashinfer"` asks for these.

Written against the `plan` / `run` API shared by flashinfer 0.3.x and 0.7.x (keyword arguments
after `page_size`).
"""

from __future__ import annotations

import importlib.util

import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.attention.flashinfer_decode import FlashInferDecode
from radixserve.runtime.attention.flashinfer_extend import FlashInferExtend
from radixserve.runtime.attention.flashinfer_plan_max import speed_up_plans
from radixserve.runtime.attention.flashinfer_plans import FlashInferPlanner, import_flashinfer
from radixserve.runtime.attention.hybrid import HybridAttention

WORKSPACE_BYTES = 128 << 20
TENSOR_CORE_MIN_GROUP = 4
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
DECODE_KERNELS = ("auto", "triton", "flashinfer")


def flashinfer_attention(
    pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    decode_tensor_cores: bool | None = None,
    prefill_backend: str = "fa2",
    workspace_bytes: int = WORKSPACE_BYTES,
    decode_kernel: str = "auto",
) -> HybridAttention:
    """`decode_kernel`: "triton" (our split-K kernel), "flashinfer" (its decode wrapper), "auto"
    (Triton when it is installed). `decode_tensor_cores` (FlashInfer's decode): None picks by
    GQA group size (>= 4). `prefill_backend`: FlashInfer's name; "fa2" shares its compiled
    module with the tensor-core decode path (one JIT build per dtype and head size), "auto"
    lets FlashInfer pick FA3 on Hopper."""
    fi = import_flashinfer()
    device = torch.device(pool.config.device)
    if device.type != "cuda":
        raise RuntimeError(f"the flashinfer attention backend needs a CUDA KV pool, got device {device}")
    if pool.config.attn_dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"the flashinfer attention backend supports float16/bfloat16 KV, got {pool.config.attn_dtype}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if decode_kernel not in DECODE_KERNELS:
        raise ValueError(f"decode_kernel={decode_kernel!r}: use auto, triton or flashinfer")
    if decode_kernel == "auto":
        decode_kernel = "triton" if importlib.util.find_spec("triton") is not None else "flashinfer"
    speed_up_plans(fi)
    planner = FlashInferPlanner(fi, pool, (num_heads, num_kv_heads, head_dim, scale), workspace_bytes)
    decode: AttentionBackend
    if decode_kernel == "triton":
        from radixserve.runtime.attention.triton_decode_backend import TritonDecodeAttention  # imports triton

        decode = TritonDecodeAttention(pool, num_heads, num_kv_heads, head_dim, scale)
    else:
        group = num_heads // num_kv_heads
        tensor_cores = group >= TENSOR_CORE_MIN_GROUP if decode_tensor_cores is None else decode_tensor_cores
        decode = FlashInferDecode(planner, tensor_cores, prefill_backend)
    return HybridAttention("flashinfer", FlashInferExtend(planner, prefill_backend), decode)
