"""The model's elementwise layer ops: RMSNorm (with the residual add; Gemma's `(1 + w)` form
too), rotary (over the whole head or its leading part), SiLU- and GeLU-tanh-and-mul.

`TorchKernels` is the reference: transformers' Llama arithmetic, op for op and
cast for cast, so float32 results on the CPU equal transformers' to the bit.
On a GPU those few lines are a dozen tiny kernels per layer (casts, pow,
mean, rsqrt, gathers of cos/sin, cat): in a CUDA-graph decode step of a
small model they took more device time than the matmuls (H200, qwen2.5-0.5b,
batch 32: about 1.5 of 3.1 ms per step). `FlashInferKernels` runs each as
one FlashInfer kernel: fused add + RMSNorm, rotary from a cos/sin cache by
position, in place on q and k, SiLU-and-mul. They compute in float32 inside
and round once, so bf16 results differ from the reference by rounding. The
attention backend applies rotary where it stores K/V (`Rope`): on CUDA in one
Triton kernel with the store, so the rope here runs only where that is missing.

Modules read their ops from a `kernels` attribute (the reference by default);
`use_kernels(model, kernels)` sets it on every module once, after loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.runtime.warm_up import KernelBuild, dtype_name


@dataclass(frozen=True)
class KernelUse:
    """Which layer ops a model calls, and in which variants: what start-up builds."""

    dtype: torch.dtype
    device: torch.device
    head_dim: int
    rotary_dim: int  # rotated leading dims of a head (<= head_dim)
    activation: str  # of the gated MLP: "silu" or "gelu_tanh"
    gemma_norms: bool  # norms scale by (1 + weight)
    qk_norm: bool  # norms over heads of q and k (rows of head_dim)


class TorchKernels:
    name = "torch"

    def kernel_builds(self, use: KernelUse) -> list[KernelBuild]:
        """What these ops compile, as start-up builds (runtime/warm_up.py): nothing here."""
        return []

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # Statistics in float32 whatever the model dtype, as transformers does.
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the residual stream's add, then the next norm."""
        h = residual + x
        return self.rms_norm(h, weight, eps), h

    def gemma_rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Gemma's norm: scaled by `1 + weight`, in float32, rounded once (transformers' order)."""
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return (h * (1.0 + weight.float())).to(x.dtype)

    def gemma_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + x
        return self.gemma_rms_norm(h, weight, eps), h

    def rope(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q `[T, Hq, D]`, k `[T, Hkv, D]`; cos/sin `[max_pos, R/2]` float32 tables, R <= D
        the rotated leading dims (partial rotary: the rest pass through)."""
        c = cos[positions].unsqueeze(1).to(q.dtype)  # [T, 1, R/2]
        s = sin[positions].unsqueeze(1).to(q.dtype)
        return _rotate(q, c, s), _rotate(k, c, s)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x * [cos, cos] + rotate_half(x) * [sin, sin], written per half, over the leading 2 * cos dims.
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# FlashInfer's rope kernel crashed the process (no error raised) at rotary dim 16 on an H100;
# below this, tiny test models rotate with the reference.
MIN_ROTARY_DIM = 64


class FlashInferKernels(TorchKernels):
    """FlashInfer's norm, rope and activation kernels (CUDA, float16/bfloat16)."""

    name = "flashinfer"

    def __init__(self, flashinfer: ModuleType) -> None:
        self._fi = flashinfer
        self._cos_sin: dict[int, torch.Tensor] = {}  # id(cos table) -> [max_pos, D] (cos | sin)

    def kernel_builds(self, use: KernelUse) -> list[KernelBuild]:
        """FlashInfer's norm module (every RMSNorm variant) and the model's activation module,
        each run once on a few rows of the model's dtype. Not its rope module: on CUDA the
        attention backend rotates q and k in its K/V store kernel (runtime/attention/kv_store.py,
        built with the backend's), and `rope` here serves only where triton is missing."""
        act = "gelu_tanh_and_mul" if use.activation == "gelu_tanh" else "silu_and_mul"
        return [
            KernelBuild(f"flashinfer norm {dtype_name(use.dtype)}", partial(self._warm_norms, use)),
            KernelBuild(f"flashinfer {act} {dtype_name(use.dtype)}", partial(self._warm_activation, use)),
        ]

    def _warm_norms(self, use: KernelUse) -> None:
        x = torch.ones(2, use.head_dim, dtype=use.dtype, device=use.device)
        w = torch.ones(use.head_dim, dtype=use.dtype, device=use.device)
        if use.gemma_norms:
            self.gemma_add_rms_norm(x.clone(), x.clone(), w, 1e-6)
            self.gemma_rms_norm(x.view(1, 2, -1) if use.qk_norm else x, w, 1e-6)
        else:
            self.add_rms_norm(x.clone(), x.clone(), w, 1e-6)
            self.rms_norm(x.view(1, 2, -1) if use.qk_norm else x, w, 1e-6)

    def _warm_activation(self, use: KernelUse) -> None:
        gate_up = torch.zeros(2, 2 * 64, dtype=use.dtype, device=use.device)
        if use.activation == "gelu_tanh":
            self.gelu_tanh_and_mul(gate_up)
        else:
            self.silu_and_mul(gate_up)

    # FlashInfer's kernels reject an empty launch grid ("invalid argument"); a step whose
    # prefill chunk ends mid-prompt asks for logits of no row, so the final norm gets 0
    # rows: every op falls back to the reference on empty input.

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not x.numel():
            return super().rms_norm(x, weight, eps)
        if x.dim() != 2:  # q/k norms over heads: the kernel takes rows
            return self._fi.norm.rmsnorm(x.reshape(-1, x.shape[-1]), weight, eps, enable_pdl=False).view(
                x.shape
            )
        return self._fi.norm.rmsnorm(x, weight, eps, enable_pdl=False)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not x.numel():
            return super().add_rms_norm(x, residual, weight, eps)
        # In place: residual += x, then x = norm(residual). Both are this step's temporaries.
        self._fi.norm.fused_add_rmsnorm(x, residual, weight, eps, enable_pdl=False)
        return x, residual

    def gemma_rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not x.numel():
            return super().gemma_rms_norm(x, weight, eps)
        rows = x.reshape(-1, x.shape[-1])
        return self._fi.norm.gemma_rmsnorm(rows, weight, eps, enable_pdl=False).view(x.shape)

    def gemma_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not x.numel():
            return super().gemma_add_rms_norm(x, residual, weight, eps)
        self._fi.norm.gemma_fused_add_rmsnorm(x, residual, weight, eps, enable_pdl=False)
        return x, residual

    def rope(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not q.numel() or 2 * cos.shape[-1] < MIN_ROTARY_DIM:
            return super().rope(positions, q, k, cos, sin)
        table = self._cos_sin.get(id(cos))
        if table is None:  # built once per model, outside any graph capture (warm-up runs first)
            table = self._cos_sin[id(cos)] = torch.cat((cos, sin), dim=-1).contiguous()
        # In place on the views of the qkv projection's output; the table's width is the
        # rotary dim, so a partial rotary leaves the head's other dims alone.
        self._fi.rope.apply_rope_with_cos_sin_cache_inplace(
            positions, q.flatten(-2), k.flatten(-2), q.shape[-1], table, is_neox=True
        )
        return q, k

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not gate_up.numel():
            return super().silu_and_mul(gate_up)
        return self._fi.activation.silu_and_mul(gate_up, enable_pdl=False)

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not gate_up.numel():
            return super().gelu_tanh_and_mul(gate_up)
        return self._fi.activation.gelu_tanh_and_mul(gate_up, enable_pdl=False)


TORCH_KERNELS = TorchKernels()
KERNEL_NAMES = ("auto", "flashinfer", "torch")


def make_kernels(name: str, device: torch.device, dtype: torch.dtype) -> TorchKernels:
    """`auto`: FlashInfer's on CUDA in float16/bfloat16 when it imports, else the reference."""
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown layer kernels {name!r}; choose one of {', '.join(KERNEL_NAMES)}")
    if name == "torch":
        return TORCH_KERNELS
    usable = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    if name == "flashinfer" and not usable:
        raise RuntimeError(
            f"layer_kernels='flashinfer' needs a CUDA device and float16/bfloat16 (got {device}, {dtype})"
        )
    if not usable:
        return TORCH_KERNELS
    try:
        import flashinfer
        import flashinfer.activation
        import flashinfer.norm
        import flashinfer.rope
    except Exception as e:  # a broken install counts as absent for auto
        if name == "flashinfer":
            raise RuntimeError(f"layer_kernels='flashinfer' needs the flashinfer package: {e}") from e
        return TORCH_KERNELS
    return FlashInferKernels(flashinfer)


def use_kernels(model: nn.Module, kernels: TorchKernels) -> None:
    """Point every module of `model` that has layer ops at `kernels`."""
    for m in model.modules():
        if hasattr(type(m), "kernels"):
            m.kernels = kernels  # type: ignore[assignment]
