"""The attention backend interface.

A backend computes causal attention for a `ForwardBatch` over the KV pool.
`plan(batch)` runs once per step, before the first layer (FlashInfer builds
its schedule there; others may precompute index tensors); `forward` runs in
every layer: it rotates the new tokens' q and k by `batch.positions` (the
layer's `Rope`), writes their K/V into the pool at `batch.out_slots`, then
attends each new token to its request's context up to and including itself.
Rotary and the K/V store are one kernel where the writer fuses them
(kv_store_select.py), which is why the backend, not the model, applies it.

CUDA-graph decode (runtime/cuda_graph.py) is part of the contract:
`decode_graphs()` gives the backend's `DecodeGraphPlanner` (decode states of a
fixed batch size, planned outside the graph), or None where decode steps run
eagerly. A backend made of others says so by composition: `HybridAttention`
(hybrid.py) runs extend steps on one backend and decode steps, with their
graphs, on another.

`AttentionOptions` carries what some models add to that: a sliding window
per layer (a mask over positions: the KV layout stays one slot per token of
the whole context) and a tanh soft-cap of the logits. A backend says which
it computes (`supports_windows`, `supports_logit_softcap`); the engine caps
the context at the smallest window where windows are missing (full attention
equals windowed attention while no sequence is longer), and refuses a
soft-capped model on a backend without soft-capping.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch

from radixserve.cache.kv_pool import KVPool
from radixserve.runtime.attention.kv_store_select import KVWriter, kv_writer
from radixserve.runtime.attention.rope import Rope
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.warm_up import KernelBuild


class DecodeGraphState(Protocol):
    """The fixed buffers of one captured decode batch size; the graph's kernels read them."""

    batch_size: int
    max_kv_tokens: int
    kv_indptr: torch.Tensor  # [bs + 1] int32, device
    kv_indices: torch.Tensor  # [max_kv_tokens] int32, device (shared between states)


class CascadeGraphState(DecodeGraphState, Protocol):
    """A cascade decode state beside the plain one of its size; its work list is uploaded
    before each replay."""

    def fits(self, groups: CascadeGroups) -> bool: ...

    def upload(self, groups: CascadeGroups, prefix_lens: np.ndarray) -> None: ...


class DecodeGraphPlanner(Protocol):
    """What decode graphs need of a backend beside `forward`: states of a fixed batch size,
    planned outside the graph, and what they can do."""

    @property
    def device_planned(self) -> bool:
        """Its states read only device buffers (no host plan per step), so decode graphs may
        build their own inputs (runtime/cuda_graph.py, `run_decode`)."""
        ...

    @property
    def cascade_graphs(self) -> bool:
        """Cascade decode steps can replay graphs of their own (`make_cuda_graph_cascade_state`)."""
        ...

    def make_cuda_graph_decode_state(self, batch_size: int, max_kv_tokens: int) -> DecodeGraphState: ...

    def plan_cuda_graph(self, state: DecodeGraphState, batch: ForwardBatch) -> None: ...

    def make_cuda_graph_cascade_state(self, plain: DecodeGraphState) -> CascadeGraphState: ...


@dataclass(frozen=True)
class AttentionOptions:
    # Per layer: how many latest positions a query sees, its own included (transformers'
    # `sliding_window`; FlashInfer's `window_left` is one less); None: all. Empty: no windows.
    windows: tuple[int | None, ...] = ()
    # Logits become cap * tanh(logits / cap) after scaling, before the mask (Gemma 2).
    logit_softcap: float | None = None

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    @property
    def min_window(self) -> int | None:
        """The smallest window of any layer; None when no layer has one."""
        sizes = [w for w in self.windows if w is not None]
        return min(sizes) if sizes else None

    @property
    def plain(self) -> bool:
        return self.min_window is None and self.logit_softcap is None

    def layer(self, layer: int) -> LayerOptions:
        return LayerOptions(self.window(layer), self.logit_softcap)


@dataclass(frozen=True)
class LayerOptions:
    """One layer's window and soft-cap, as a kernel call takes them (see `AttentionOptions`),
    and its (K, V) scales when the pool is FP8 (cache/kv_quant.py; None: not quantized)."""

    window: int | None = None
    softcap: float | None = None
    kv_scales: tuple[float, float] | None = None

    @property
    def masked(self) -> bool:
        """A window or a soft-cap, which cascade steps do not compute."""
        return self.window is not None or self.softcap is not None


PLAIN_LAYER = LayerOptions()


class AttentionBackend(ABC):
    name: str = "base"
    # Its kernels are Triton's, so its K/V writer is too, on the CPU under the interpreter as well.
    triton_kernels: bool = False

    def __init__(
        self,
        pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        options: AttentionOptions | None = None,
    ) -> None:
        if num_heads % num_kv_heads:  # every kernel maps a query head to head // group
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # The model's windows and soft-cap; only backends that compute them are given any.
        self.options = options or AttentionOptions()
        c = pool.config
        self.layer_options = [
            replace(self.options.layer(i), kv_scales=(c.k_scale(i), c.v_scale(i)) if c.fp8 else None)
            for i in range(c.num_layers)
        ]
        self._write_kv: KVWriter = kv_writer(pool, self.triton_kernels)

    @property
    def supports_cascade(self) -> bool:
        """Reads a decode batch's `cascade` groups (each shared prefix once per group);
        a backend without it computes the same attention from the whole contexts."""
        return False

    @property
    def graph_extend(self) -> bool:
        """Its forward runs `ForwardBatch.graph` steps (our Triton kernels, no plan), so
        extend steps may replay CUDA graphs (runtime/extend_graphs.py)."""
        return False

    @property
    def supports_windows(self) -> bool:
        """Computes `AttentionOptions.windows` (see the module docstring)."""
        return False

    @property
    def supports_logit_softcap(self) -> bool:
        """Computes `AttentionOptions.logit_softcap`."""
        return False

    def decode_graphs(self) -> DecodeGraphPlanner | None:
        """The maker of this backend's CUDA-graph decode states; None: decode runs eagerly."""
        return None

    @abstractmethod
    def kernel_builds(self, cascade: bool) -> list[KernelBuild]:
        """What this backend's steps compile, as builds to run once at start-up
        (runtime/warm_up.py), each running its kernel on a tiny batch so that a JIT build
        happens there rather than in a request's step; empty where nothing compiles.
        `cascade`: the engine forms shared-prefix groups, so cascade steps' kernels too."""

    def plan(self, batch: ForwardBatch) -> None:  # noqa: B027 - optional hook, not abstract
        """Prepare per-step state shared by all layers. Default: nothing."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        batch: ForwardBatch,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        """q `[T, Hq, D]`, k/v `[T, Hkv, D]` for the step's new tokens -> `[T, Hq, D]`; q and k
        before `rope` (None: they come rotated), rotated (q in place where the writer fuses it)
        and k, v stored at `batch.out_slots` by this backend's writer, then `attend`."""
        q = self._write_kv(self.pool, layer, batch.out_slots, batch.positions, q, k, v, rope)
        return self.attend(q, layer, batch)

    @abstractmethod
    def attend(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """The new tokens' rotated q `[T, Hq, D]` attending their contexts in the pool, their
        own K/V already written there -> `[T, Hq, D]`."""
