"""A checkpoint's `quantization_config` (config.json): what FP8 layout its tensors have.

Two FP8 layouts load (docs/fp8.md):

- compressed-tensors (`quant_method: "compressed-tensors"`, llm-compressor's output):
  `format` "float-quantized" or "naive-quantized", every config group with 8-bit
  float weights scaled per tensor or per channel (`<name>.weight` float8_e4m3fn,
  `<name>.weight_scale` of shape `[]`, `[1]` or `[out, 1]`) and 8-bit float input
  activations, dynamic per token or static per tensor (`<name>.input_scale`); or
  (`FP8_BLOCK`) weights per `block_structure` tile, `weight_scale` `[ceil(N / bn),
  ceil(K / bk)]`, and activations dynamic per token group of `bk` columns;
- transformers' fine-grained FP8 (`quant_method: "fp8"`): with `weight_block_size`
  `[block_n, block_k]` (its default `[128, 128]` when the field is absent: DeepSeek-V3,
  the Qwen3 FP8 releases) one `weight_scale_inv` per weight tile, `[ceil(N / block_n),
  ceil(K / block_k)]`, and activations quantized per token in groups of `block_k`
  (runtime/fp8_block.py); with `weight_block_size: null` one per tensor. transformers
  multiplies by `weight_scale_inv`, despite the name.

The activations run dynamic here (per token, or per token group with block scales): a static
`input_scale` / `activation_scale` is read past (one calibrated scale per tensor is coarser).
Everything else is refused at load with a message that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

QUANT_METHODS = ("compressed-tensors", "fp8")
CT_FORMATS = ("float-quantized", "naive-quantized")
WEIGHT_STRATEGIES = ("tensor", "channel", "block")
ACTIVATION_STRATEGIES = ("token", "tensor", "group")

_FIELD = "quantization_config"


class UnsupportedQuantizationError(ValueError):
    pass


@dataclass(frozen=True)
class Fp8Checkpoint:
    """How a checkpoint stores its FP8 linears: the name of each weight's scale tensor
    and the tensors that are read past."""

    quant_method: str
    scale_name: str  # "weight_scale" (compressed-tensors) or "weight_scale_inv" (fp8)
    skipped: tuple[str, ...]  # static activation scales: activations run per token here
    # [block_n, block_k]: one weight scale per tile of that many rows and columns; None: per
    # row (a per-tensor scale is repeated over the rows).
    weight_block: tuple[int, int] | None = None


def read_quantization(raw: Mapping[str, object]) -> Fp8Checkpoint | None:
    """The FP8 layout config.json's `quantization_config` describes; None without one."""
    q = raw.get(_FIELD)
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise UnsupportedQuantizationError(f"{_FIELD} must be an object, got {q!r}")
    method = q.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "fp8":
        return _finegrained(q)
    raise UnsupportedQuantizationError(
        f"{_FIELD}.quant_method={method!r} is not supported: FP8 checkpoints load "
        f"({', '.join(QUANT_METHODS)}); other quantized checkpoints do not"
    )


def _compressed_tensors(q: Mapping[str, object]) -> Fp8Checkpoint:
    fmt = q.get("format")
    if fmt not in CT_FORMATS:
        raise UnsupportedQuantizationError(
            f"{_FIELD}.format={fmt!r} is not supported (compressed-tensors FP8: {', '.join(CT_FORMATS)})"
        )
    kv = q.get("kv_cache_scheme")
    if kv is not None:
        _check_kv_cache_scheme(kv)
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise UnsupportedQuantizationError(f"{_FIELD}.config_groups is missing or empty")
    blocks: set[tuple[int, int] | None] = set()
    for name, group in groups.items():
        where = f"{_FIELD}.config_groups.{name}"
        if not isinstance(group, Mapping):
            raise UnsupportedQuantizationError(f"{where} must be an object")
        block = _check_weights(group.get("weights"), f"{where}.weights")
        _check_activations(group.get("input_activations"), f"{where}.input_activations", block)
        blocks.add(block)
    if len(blocks) > 1:
        raise UnsupportedQuantizationError(
            f"{_FIELD}.config_groups mix weight blocks {sorted(map(str, blocks))}: one layout per checkpoint"
        )
    return Fp8Checkpoint("compressed-tensors", "weight_scale", ("input_scale",), blocks.pop())


def _check_kv_cache_scheme(kv: object) -> None:
    """FP8 K/V scales per tensor (`self_attn.k_scale` / `v_scale`, model/kv_scales.py) load and
    serve `kv_cache_dtype="fp8_e4m3"`; other KV schemes are refused."""
    where = f"{_FIELD}.kv_cache_scheme"
    if not isinstance(kv, Mapping) or kv.get("num_bits") != 8 or kv.get("type") != "float":
        raise UnsupportedQuantizationError(f"{where}={kv!r}: only an 8-bit float KV cache is supported")
    if kv.get("strategy") != "tensor" or kv.get("dynamic"):
        raise UnsupportedQuantizationError(
            f"{where}.strategy={kv.get('strategy')!r}, dynamic={kv.get('dynamic')!r}: only static "
            "per-tensor KV cache scales are supported"
        )


def _check_weights(w: object, where: str) -> tuple[int, int] | None:
    """The group's weight block (`strategy: "block"`, `block_structure`), or None."""
    if not isinstance(w, Mapping):
        raise UnsupportedQuantizationError(f"{where} is missing: only quantized weights load")
    if w.get("num_bits") != 8 or w.get("type") != "float":
        raise UnsupportedQuantizationError(
            f"{where}: num_bits={w.get('num_bits')!r}, type={w.get('type')!r} is not supported "
            "(only FP8 weights: num_bits 8, type float)"
        )
    strategy = w.get("strategy")
    if strategy not in WEIGHT_STRATEGIES:
        raise UnsupportedQuantizationError(
            f"{where}.strategy={strategy!r} is not supported (FP8 weight scales per "
            f"{' or per '.join(WEIGHT_STRATEGIES)})"
        )
    if w.get("dynamic"):
        raise UnsupportedQuantizationError(f"{where}.dynamic=true is not supported for weights")
    if w.get("symmetric") is False:
        raise UnsupportedQuantizationError(f"{where}.symmetric=false (zero points) is not supported")
    if strategy != "block":
        return None
    return _block(w.get("block_structure"), f"{where}.block_structure")


def _check_activations(a: object, where: str, block: tuple[int, int] | None) -> None:
    """Per token or per tensor beside scales per row; per token group of the weight block's
    columns beside block scales (llm-compressor's FP8_BLOCK)."""
    if a is None:
        raise UnsupportedQuantizationError(
            f"{where}=null (weight-only FP8) is not supported: the FP8 GEMM here quantizes "
            "activations per token, which such a checkpoint was not made for"
        )
    if not isinstance(a, Mapping) or a.get("num_bits") != 8 or a.get("type") != "float":
        raise UnsupportedQuantizationError(f"{where}: only 8-bit float activations are supported")
    strategy = a.get("strategy")
    if strategy not in ACTIVATION_STRATEGIES:
        raise UnsupportedQuantizationError(
            f"{where}.strategy={strategy!r} is not supported ({', '.join(ACTIVATION_STRATEGIES)})"
        )
    if (strategy == "group") != (block is not None) or (
        block is not None and a.get("group_size") != block[1]
    ):
        raise UnsupportedQuantizationError(
            f"{where}: strategy={strategy!r}, group_size={a.get('group_size')!r} beside weight "
            f"blocks {block}: activations run per token group of the block's columns with block "
            "scales, per token otherwise"
        )


def _finegrained(q: Mapping[str, object]) -> Fp8Checkpoint:
    # transformers' FineGrainedFP8Config defaults weight_block_size to [128, 128].
    raw = q.get("weight_block_size", [128, 128])
    block = None if raw is None else _block(raw, f"{_FIELD}.weight_block_size")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise UnsupportedQuantizationError(f"{_FIELD}.activation_scheme={scheme!r} is not supported")
    fmt = q.get("scale_fmt", "float")
    if fmt != "float":
        raise UnsupportedQuantizationError(f"{_FIELD}.scale_fmt={fmt!r} is not supported (float)")
    return Fp8Checkpoint("fp8", "weight_scale_inv", ("activation_scale",), block)


def _block(block: object, where: str) -> tuple[int, int]:
    """`[block_n, block_k]` as a tuple, or an error naming the field."""
    if (
        not isinstance(block, list | tuple)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise UnsupportedQuantizationError(
            f"{where}={block!r} is not supported: two positive integers [rows, columns]"
        )
    return (block[0], block[1])
