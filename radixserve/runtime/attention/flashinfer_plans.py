"""FlashInfer plumbing shared by the backend's plans: the import, the guard that keeps
two plans of one wrapper from racing on its pinned buffer, and pinned plan inputs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from radixserve.cache.kv_pool import KVPool


def import_flashinfer() -> ModuleType:
    """The flashinfer module, or an ImportError that says how to get it."""
    try:
        import flashinfer
    except ImportError as e:
        raise ImportError(
            "the flashinfer attention backend needs the flashinfer-python package "
            "(pip install 'flashinfer-python>=0.3.1'; offline GPU machines: scripts/build_gpu_wheels.sh)"
        ) from e
    return flashinfer


class PlanGuard:
    """Waits until a wrapper's previous plan has left its pinned host buffer.

    FlashInfer's plan writes the schedule into a pinned host buffer and queues
    an async copy to the device without waiting. A second plan of the same
    wrapper before that copy ran would overwrite the first schedule; the event
    makes that impossible. Wrappers alternate between steps, so by the time a
    wrapper is planned again its copy is long done and the wait is free.
    """

    def __init__(self) -> None:
        self._event: torch.cuda.Event | None = None

    def before_plan(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def after_plan(self) -> None:
        if self._event is None:
            self._event = torch.cuda.Event()
        self._event.record()


@dataclass
class PlanSlot:
    wrapper: Any  # a FlashInfer wrapper (flashinfer has no type hints)
    guard: PlanGuard = field(default_factory=PlanGuard)


@dataclass
class FlashInferDecodeGraphState:
    """A decode wrapper with fixed-size page-table buffers for one batch size."""

    batch_size: int
    max_kv_tokens: int
    slot: PlanSlot
    kv_indptr: torch.Tensor  # [bs + 1] int32, device
    kv_indices: torch.Tensor  # [max_kv_tokens] int32, device (shared between states)
    last_page_len: torch.Tensor  # [bs] int32, device


def host_indptr(lengths: list[int]) -> torch.Tensor:
    # Pinned: FlashInfer copies plan inputs to the device with non_blocking=True,
    # which from pageable memory would wait for the whole stream (a hidden sync).
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32).pin_memory()


def pinned_ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.int32).pin_memory()


class FlashInferPlanner:
    """What FlashInfer's wrappers share in one engine: the module, one float workspace (the
    wrappers run one after another on one stream), the attention shape, and the pool's
    layers as FlashInfer's paged cache with one token per page (`[num_slots, 1, Hkv, D]`
    views, so `kv_indptr` / `kv_indices` are its page table as they stand)."""

    def __init__(
        self, fi: ModuleType, pool: KVPool, shape: tuple[int, int, int, float], workspace_bytes: int
    ) -> None:
        """`shape`: (query heads, KV heads, head size, softmax scale)."""
        self.fi = fi
        self.pool = pool
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = shape
        self.dtype = pool.config.attn_dtype  # the queries' and outputs'
        self.kv_dtype = pool.config.dtype  # float8_e4m3fn for an FP8 pool
        c = pool.config
        # Per layer, the scales `run` takes for an FP8 pool (none at 1.0: each costs FlashInfer
        # a multiply, V's a kernel of its own).
        self.run_scales: list[dict[str, float]] = [
            {n: s for n, s in (("k_scale", c.k_scale(i)), ("v_scale", c.v_scale(i))) if s != 1.0}
            for i in range(c.num_layers)
        ]
        self.device = torch.device(pool.config.device)
        # Zeroed once: FlashInfer requires a zeroed float workspace on first use.
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        hkv, d = self.num_kv_heads, self.head_dim
        self.caches = [
            (k.view(-1, 1, hkv, d), v.view(-1, 1, hkv, d)) for k, v in zip(pool.k, pool.v, strict=True)
        ]

    def pair(self, make: Any, **kw: object) -> list[PlanSlot]:  # Any: an untyped FlashInfer class
        """Two wrappers of one kind, alternated per step (see PlanGuard)."""
        return [PlanSlot(make(self.workspace, "NHD", **kw)) for _ in range(2)]

    def plan_prefill(
        self, slot: PlanSlot, qo_lens: list[int], kv_lens: list[int], indices: torch.Tensor, causal: bool
    ) -> None:
        """Plan a prefill wrapper: request i has qo_lens[i] queries over kv_lens[i] slots."""
        slot.guard.before_plan()
        slot.wrapper.plan(
            host_indptr(qo_lens),
            host_indptr(kv_lens),
            indices,
            pinned_ones(len(kv_lens)),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            causal=causal,
            pos_encoding_mode="NONE",
            sm_scale=self.scale,
            q_data_type=self.dtype,
            kv_data_type=self.kv_dtype,
            non_blocking=True,
        )
        slot.guard.after_plan()

    def plan_decode(self, slot: PlanSlot, lens: list[int], indices: torch.Tensor) -> None:
        """Plan a decode wrapper: row i attends to lens[i] slots."""
        slot.guard.before_plan()
        slot.wrapper.plan(
            host_indptr(lens),
            indices,
            pinned_ones(len(lens)),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            pos_encoding_mode="NONE",
            q_data_type=self.dtype,
            kv_data_type=self.kv_dtype,
            sm_scale=self.scale,
            non_blocking=True,
        )
        slot.guard.after_plan()

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """`q` in the attention dtype (the cache's; the model's over an FP8 cache), element-dense.
        Rows may be strided (q is a view of the fused qkv output): the kernels take a row and a
        head stride, so only the element must be dense."""
        qc = q.to(self.dtype)
        return qc if qc.stride(-1) == 1 else qc.contiguous()
