"""Build what an `AsyncEngine` runs on: model, KV pool, radix cache, scheduler, runner.

Runs in a thread at `start()` (loading takes seconds); engines build one at a
time because transformers' lazy imports are not thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import torch

from radixserve.cache.allocator import SlotAllocator
from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.cache.kv_quant import KV_CACHE_DTYPES
from radixserve.cache.radix_tree import RadixCache
from radixserve.cache.req_table import ReqToSlotTable
from radixserve.config import EngineConfig
from radixserve.model.fp8 import fp8_use
from radixserve.model.layers import use_matmul
from radixserve.model.loader import LoadedModel, load_model
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.fp8_builds import kernel_builds as fp8_kernel_builds
from radixserve.runtime.fp8_linear import MIN_CAPABILITY
from radixserve.runtime.kernels import KernelUse, make_kernels, use_kernels
from radixserve.runtime.matmul import make_matmul
from radixserve.runtime.runner import ModelRunner
from radixserve.runtime.workspace import sampling_workspace_bytes
from radixserve.sched.scheduler import Scheduler

_CPU_KV_BUDGET = 1 << 30  # bytes of KV pool on the CPU when nothing is said
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class EngineParts:
    loaded: LoadedModel
    pool: KVPool
    scheduler: Scheduler
    runner: ModelRunner
    context_length: int  # the engine's context: the config's, capped by the model's


def build_parts(cfg: EngineConfig) -> EngineParts:
    with _BUILD_LOCK:
        return _build(cfg)


def _build(cfg: EngineConfig) -> EngineParts:
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    check_kv_cache_device(cfg, device)  # before the weights are read
    loaded = load_model(
        cfg.model, dtype=dtype, device=device, load_format=cfg.load_format, quantization=cfg.quantization
    )
    kernels = make_kernels(cfg.layer_kernels, device, dtype)
    use_kernels(loaded.model, kernels)
    mc = loaded.config
    if cfg.deterministic and loaded.quantization is not None:  # quantization=None: the checkpoint's own
        raise ValueError(
            f"EngineConfig.deterministic=True: {cfg.model} is an FP8 checkpoint, and the FP8 product "
            "has no batch-invariant kernel; use a bf16 or fp32 checkpoint"
        )
    if cfg.deterministic and mc.moe is not None and device.type == "cuda":
        raise ValueError(
            f"EngineConfig.deterministic=True: {cfg.model} is a mixture of experts, whose fused CUDA "
            "kernel groups tokens by expert across the batch; deterministic MoE runs on the CPU only"
        )
    use_matmul(loaded.model, make_matmul(cfg.deterministic, device))
    context_length = min(cfg.context_length or mc.max_context_len, mc.max_context_len)
    pool_cfg = kv_pool_config(cfg, loaded, dtype, device)
    num_slots = kv_slots(cfg, pool_cfg.bytes_per_slot, device, context_length, mc.vocab_size)
    # One slot more than the allocator hands out: the scratch slot that padded
    # CUDA-graph rows write to.
    pool = KVPool(pool_cfg, num_slots + 1)
    options = mc.attention_options()
    attn = make_attention_backend(
        cfg.attention_backend,
        pool,
        mc.num_heads,
        mc.num_kv_heads,
        mc.head_dim,
        mc.attn_scale,
        decode_kernel=cfg.decode_kernel,
        options=options,
        deterministic=cfg.deterministic,
    )
    if options.min_window is not None and not attn.supports_windows:
        # Full attention equals windowed attention while no sequence is longer than the window.
        context_length = min(context_length, options.min_window)
    allocator = SlotAllocator(num_slots)
    cache = RadixCache(allocator, page_size=cfg.page_size)
    table = ReqToSlotTable(cfg.max_running_requests, context_length + 1, device=device)
    sched_cfg = cfg.scheduler_config(mc.vocab_size)
    if not attn.supports_cascade or (cfg.cascade_attention is None and not cascade_graphs(cfg, attn)):
        # Its kernels would ignore the groups, or (the default) its cascade steps would run
        # eagerly: don't form them.
        sched_cfg = replace(sched_cfg, cascade_min_shared=0)
    scheduler = Scheduler(sched_cfg, allocator, cache, table, loaded.tokenizer)
    runner = ModelRunner(
        loaded.model, attn, mc.vocab_size, cfg.max_running_requests, device, slot_table=table.device_table
    )
    # Every kernel a step will run is compiled (or loaded) now, not in a request's step.
    use = KernelUse(dtype, device, mc.head_dim, mc.rope_dim, mc.activation, mc.norm_plus_one, mc.qk_norm)
    builds = [*attn.kernel_builds(sched_cfg.cascade_min_shared > 0), *kernels.kernel_builds(use)]
    if loaded.quantization == "fp8" and device.type == "cuda":
        builds += fp8_kernel_builds(fp8_use(loaded.model, dtype, device, mc.norm_plus_one))
    runner.warm_up(builds)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # weights and pool filled before the runner's stream reads them
    if cfg.cuda_graph and device.type == "cuda":
        max_kv = min(cfg.max_running_requests * (context_length + 1), 1 << 26)
        runner.enable_cuda_graphs(
            cfg.max_running_requests,
            max_kv,
            scratch_slot=num_slots,
            extend_tokens=cfg.extend_graph_tokens,
            cascade=sched_cfg.cascade_min_shared > 0,
        )
    return EngineParts(loaded, pool, scheduler, runner, context_length)


def check_kv_cache_device(cfg: EngineConfig, device: torch.device) -> None:
    """An FP8 KV cache on CUDA needs FP8 conversions in hardware (the Triton kernels' e4m3
    loads and stores); the CPU's torch reference runs it in any dtype."""
    if cfg.kv_cache_dtype == "auto" or device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ValueError(
            f"kv_cache_dtype={cfg.kv_cache_dtype!r} needs a GPU of compute capability >= 8.9 "
            f"(Ada, Hopper or newer); {device} has {capability[0]}.{capability[1]}: use kv_cache_dtype='auto'"
        )


def kv_pool_config(
    cfg: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, device: torch.device
) -> KVPoolConfig:
    """The pool's layout; with `kv_cache_dtype` FP8, its element type and the checkpoint's
    per-layer K/V scales (1.0 without them). Its bytes per slot size the pool, so the same
    memory holds twice the tokens of a 16-bit cache."""
    pool_cfg = loaded.config.kv_pool_config(dtype, device)
    if cfg.kv_cache_dtype == "auto":
        return pool_cfg
    scales = loaded.kv_scales
    return replace(
        pool_cfg,
        dtype=KV_CACHE_DTYPES[cfg.kv_cache_dtype],
        compute_dtype=dtype,
        k_scales=scales.k if scales is not None else (),
        v_scales=scales.v if scales is not None else (),
    )


def cascade_graphs(cfg: EngineConfig, attn: AttentionBackend) -> bool:
    """Whether the engine's cascade decode steps would replay CUDA graphs (what
    `cascade_attention=None` turns grouping on for)."""
    on_gpu = cfg.cuda_graph and cfg.torch_device().type == "cuda"
    planner = attn.decode_graphs()
    return on_gpu and planner is not None and planner.cascade_graphs


def kv_slots(
    cfg: EngineConfig, bytes_per_slot: int, device: torch.device, context_length: int, vocab_size: int
) -> int:
    """KV slots to allocate: as configured, else `mem_fraction` of the GPU memory free beside the
    sampler's workspace (measured: runtime/workspace.py), else a CPU budget."""
    if cfg.kv_cache_tokens is not None:
        return cfg.kv_cache_tokens
    if cfg.kv_cache_bytes is not None:
        return max(1, cfg.kv_cache_bytes // bytes_per_slot)
    if device.type == "cuda":
        try:
            workspace = sampling_workspace_bytes(cfg.max_running_requests, vocab_size, device)
        except torch.OutOfMemoryError as e:
            raise RuntimeError(
                f"sampling {cfg.max_running_requests} rows of a {vocab_size}-token vocabulary needs "
                "more GPU memory than is free after loading the model: lower max_running_requests"
            ) from e
        free, _ = torch.cuda.mem_get_info(device)
        # The model's activations and graphs live in the rest of the fraction.
        slots = int(max(free - workspace, 0) * cfg.mem_fraction) // bytes_per_slot - 1
        if slots < context_length:
            raise RuntimeError(
                f"only {free / 2**30:.1f} GiB of GPU memory is free after loading the model, "
                f"{workspace / 2**30:.1f} GiB of it for sampling {cfg.max_running_requests} rows: "
                f"{max(slots, 0)} KV slots, fewer than one full context ({context_length}); "
                f"pass context_length={max(slots, 0)} or less, free memory, raise mem_fraction, "
                "lower max_running_requests, or use kv_cache_dtype='fp8_e4m3' (twice the tokens)"
            )
        return slots
    return max(1, min(_CPU_KV_BUDGET // bytes_per_slot, 64 * context_length))
