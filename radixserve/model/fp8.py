"""Which linears of a model run in FP8, and the checks that FP8 can run where it is loaded.

Two ways in (docs/fp8.md):

- an FP8 checkpoint: the linears whose weight the files store as float8_e4m3fn
  become FP8 before loading (`Linear.to_fp8`); the others (the checkpoint's ignore
  list, usually lm_head) load as stored;
- `quantization="fp8"` over a high-precision checkpoint: after loading, every
  linear of the decoder layers is quantized per output channel (absmax / 448).

The embeddings, norms, lm_head and the MoE router (and Qwen2-MoE's shared-expert
gate) stay in the model dtype, as vLLM and SGLang keep them by default: they are a
small share of the weights and the logits and routing decisions are the most
sensitive to rounding. MoE expert weights stay in the model dtype too (the stacked
experts have no FP8 path yet), so an FP8 checkpoint with FP8 experts is refused.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from radixserve.model.decoder import DecoderLayer, GatedMLP, norm_fuses_quantizer
from radixserve.model.layers import FusedLinear, Linear
from radixserve.model.moe import SparseMoE
from radixserve.model.weights import checkpoint_modules
from radixserve.runtime.fp8_block import check_block_device, check_block_shape
from radixserve.runtime.fp8_builds import Fp8Use
from radixserve.runtime.fp8_linear import CUDA_DTYPES, GEMM_ALIGN, check_capability

QUANTIZATIONS = ("fp8",)
FP8_SAFETENSORS = "F8_E4M3"


def quantizable_linears(model: nn.Module) -> list[tuple[str, Linear]]:
    """The linears `quantization="fp8"` quantizes: all but lm_head and the MoE gates."""
    kept: set[int] = set()
    for name, module in model.named_modules():
        if isinstance(module, SparseMoE):
            kept.add(id(module.gate))
            if module.shared_expert_gate is not None:
                kept.add(id(module.shared_expert_gate))
        if name == "lm_head":
            kept.add(id(module))
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Linear) and id(m) not in kept]


@torch.no_grad()
def quantize_model_(model: nn.Module) -> None:
    """Quantize the loaded high-precision weights of `quantizable_linears` to FP8 in place."""
    for _, linear in quantizable_linears(model):
        if not linear.is_fp8:
            linear.quantize_fp8_()


def fp8_use(model: nn.Module, dtype: torch.dtype, device: torch.device, plus_one: bool) -> Fp8Use:
    """The widths the model's FP8 linears quantize (runtime/fp8_builds.py compiles each at start): a
    linear's own quantizer only where no fused kernel quantizes for it (the first layer's qkv and
    every o_proj take it; so would a norm wider than the fused one holds)."""
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP) and m.fuses_silu_quantizer]
    silu_fed = {id(m.down_proj) for m in mlps}  # their input comes from the fused SiLU·mul quantizer
    linears = [
        m for m in model.modules() if isinstance(m, Linear) and m.row_scaled_fp8 and id(m) not in silu_fed
    ]
    norm_inputs = [m.self_attn.qkv_proj for m in model.modules() if isinstance(m, DecoderLayer)]
    fused = [m for m in norm_inputs if norm_fuses_quantizer(m)]
    return Fp8Use(
        dtype,
        device,
        input_widths=tuple(sorted({m.in_features for m in linears})),
        silu_widths=tuple(sorted({m.down_proj.in_features for m in mlps})),
        norm_width=fused[0].in_features if fused else None,
        plus_one=plus_one,
    )


def fp8_weight_names(files: list[Path]) -> set[str]:
    """Names of the tensors the checkpoint stores as float8_e4m3fn (headers only)."""
    names: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if f.get_slice(name).get_dtype() == FP8_SAFETENSORS:
                    names.add(name)
    return names


def prepare_fp8_checkpoint(model: nn.Module, files: list[Path], block: tuple[int, int] | None = None) -> int:
    """Turn the linears whose checkpoint weights are FP8 into FP8 linears (scaled per row, or per
    `block` tile), before loading; returns how many. Refuses FP8 tensors the model has no FP8
    path for, and fused projections whose parts disagree."""
    fp8 = fp8_weight_names(files)
    if not fp8:
        return 0
    modules = checkpoint_modules(model)
    head = dict(model.named_modules()).get("lm_head")
    owners: dict[int, Linear] = {}
    for name in sorted(fp8):
        module = modules.get(name)
        if module is None:
            continue  # not a tensor of ours: loading names it
        if not isinstance(module, Linear) or not name.endswith(".weight") or module is head:
            raise ValueError(
                f"FP8 tensor {name!r} in {files[0].parent}: only the decoder layers' linear weights "
                "load as FP8 here (not MoE experts, embeddings or lm_head)"
            )
        owners[id(module)] = module
    for name, module in modules.items():
        fused = isinstance(module, FusedLinear) and id(module) in owners
        if fused and name.endswith(".weight") and name not in fp8:
            raise ValueError(
                f"{name!r} in {files[0].parent} is not FP8 while the other parts of its fused "
                "projection are: all or none of q/k/v (gate/up) must be quantized"
            )
    for module in owners.values():
        module.to_fp8(block)
    return len(owners)


def require_fp8_device(
    device: torch.device, dtype: torch.dtype, block: tuple[int, int] | None = None
) -> None:
    """On CUDA: FP8 tensor cores (Hopper's for `block` scales), triton, and a dtype the scaled
    GEMMs write. The CPU runs the reference in any dtype."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    check_capability(capability, str(device))
    if block is not None:
        check_block_device(capability, str(device))
    if importlib.util.find_spec("triton") is None:
        raise ValueError(
            "FP8 weights on CUDA need triton (it quantizes each linear's input): "
            "pip install 'radixserve[gpu]'"
        )
    if dtype not in CUDA_DTYPES:
        raise ValueError(
            f"FP8 weights on CUDA need dtype bfloat16 or float16 (the scaled GEMM's output), not {dtype}"
        )


def check_fp8_shapes(model: nn.Module, device: torch.device) -> None:
    """On CUDA, every FP8 linear's dims suit its GEMM: multiples of the row-scaled GEMM's
    alignment, or whole 128 x 128 blocks."""
    if device.type != "cuda":
        return
    for name, m in model.named_modules():
        if isinstance(m, Linear) and m.weight_block is not None:
            check_block_shape(name, m.out_features, m.in_features, m.weight_block)
        elif (
            isinstance(m, Linear) and m.is_fp8 and (m.in_features % GEMM_ALIGN or m.out_features % GEMM_ALIGN)
        ):
            raise ValueError(
                f"FP8 linear {name} is {m.out_features}x{m.in_features}: the CUDA FP8 GEMM needs "
                f"both dims multiples of {GEMM_ALIGN}"
            )
