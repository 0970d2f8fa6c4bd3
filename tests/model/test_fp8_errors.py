"""FP8 configurations that cannot run are refused at load, naming the field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, EngineConfig
from radixserve.model.loader import load_model
from radixserve.model.quant_config import UnsupportedQuantizationError, read_quantization
from radixserve.runtime.fp8_linear import (
    check_capability,
    quantize_rows,
    reference_linear,
    scaled_mm_linear,
)
from tests.model.test_fp8 import to_compressed_tensors

_FP8_GROUP = {
    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
}


def _ct(**changes: Any) -> dict[str, Any]:
    q: dict[str, Any] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": dict(_FP8_GROUP)},
    }
    return {"quantization_config": q | changes}


def test_engine_config_quantization_is_validated() -> None:
    assert EngineConfig().quantization is None
    assert EngineConfig(quantization="fp8").quantization == "fp8"
    for bad in ("int4", "FP8", ""):
        with pytest.raises(ValueError, match=r"EngineConfig\.quantization"):
            EngineConfig(quantization=bad)
    with pytest.raises(ValueError, match="quantization 'int8'"):
        load_model("dummy:tiny-llama", quantization="int8")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (
            {"quantization_config": {"quant_method": "awq", "bits": 4}},
            r"quantization_config\.quant_method='awq'",
        ),
        ({"quantization_config": {"quant_method": "gptq"}}, r"quantization_config\.quant_method"),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
            r"quantization_config\.weight_block_size=\[128\]",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 0]}},
            r"quantization_config\.weight_block_size=\[128, 0\]",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [True, 128]}},
            r"quantization_config\.weight_block_size",
        ),
        (_ct(format="pack-quantized"), r"quantization_config\.format"),
        (_ct(kv_cache_scheme={"num_bits": 8}), r"quantization_config\.kv_cache_scheme"),
        (
            _ct(config_groups={"g": {**_FP8_GROUP, "weights": {"num_bits": 4, "type": "int"}}}),
            r"quantization_config\.config_groups\.g\.weights",
        ),
        (
            _ct(
                config_groups={"g": {**_FP8_GROUP, "weights": {**_FP8_GROUP["weights"], "strategy": "block"}}}
            ),
            r"config_groups\.g\.weights\.block_structure=None",
        ),
        (
            _ct(
                config_groups={
                    "g": {
                        **_FP8_GROUP,
                        "weights": {
                            **_FP8_GROUP["weights"],
                            "strategy": "block",
                            "block_structure": [128, 128],
                        },
                    }
                }
            ),
            r"config_groups\.g\.input_activations: strategy='token'.* beside weight blocks \(128, 128\)",
        ),
        (
            _ct(
                config_groups={
                    "g": {
                        **_FP8_GROUP,
                        "input_activations": {
                            **_FP8_GROUP["input_activations"],
                            "strategy": "group",
                            "group_size": 128,
                        },
                    }
                }
            ),
            r"config_groups\.g\.input_activations: strategy='group'",
        ),
        (
            _ct(
                config_groups={
                    "g": {
                        "weights": {
                            **_FP8_GROUP["weights"],
                            "strategy": "block",
                            "block_structure": [128, 128],
                        },
                        "input_activations": {
                            **_FP8_GROUP["input_activations"],
                            "strategy": "group",
                            "group_size": 64,
                        },
                    }
                }
            ),
            r"group_size=64 beside weight blocks \(128, 128\)",
        ),
        (
            _ct(
                config_groups={"g": {**_FP8_GROUP, "weights": {**_FP8_GROUP["weights"], "symmetric": False}}}
            ),
            r"config_groups\.g\.weights\.symmetric=false",
        ),
        (
            _ct(config_groups={"g": {**_FP8_GROUP, "input_activations": None}}),
            r"config_groups\.g\.input_activations=null",
        ),
    ],
)
def test_unsupported_quantization_configs(config: dict[str, Any], field: str) -> None:
    with pytest.raises(UnsupportedQuantizationError, match=field):
        read_quantization(config)


def test_supported_quantization_configs() -> None:
    assert read_quantization({}) is None
    ct = read_quantization(_ct())
    assert ct is not None and ct.scale_name == "weight_scale"
    fg = read_quantization({"quantization_config": {"quant_method": "fp8", "weight_block_size": None}})
    assert fg is not None and fg.scale_name == "weight_scale_inv" and fg.weight_block is None
    # transformers' default when the field is absent: 128 x 128 tiles.
    default = read_quantization({"quantization_config": {"quant_method": "fp8"}})
    assert default is not None and default.weight_block == (128, 128)
    block = read_quantization({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 32]}})
    assert block is not None and block.weight_block == (64, 32)


def test_unsupported_checkpoint_fails_at_load(tmp_path: Path, helpers: Any) -> None:
    helpers.make_tiny_checkpoint("llama3-rope", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, -1]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"quantization_config\.weight_block_size"):
        load_model(str(tmp_path))


def test_fp8_needs_compute_capability_8_9() -> None:
    for ok in ((8, 9), (9, 0), (10, 0), (12, 0)):
        check_capability(ok, "cuda:0")
    for old in ((7, 5), (8, 0), (8, 6), (8, 7)):
        with pytest.raises(ValueError, match=r"compute capability >= 8\.9.*cuda:1 has \d\.\d"):
            check_capability(old, "cuda:1")


def test_fp8_on_an_old_gpu_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's device check reads the GPU's capability (faked here: no GPU needed)."""
    from radixserve.model.fp8 import require_fp8_device

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    with pytest.raises(ValueError, match=r"cuda:0 has 8\.6"):
        require_fp8_device(torch.device("cuda:0"), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    require_fp8_device(torch.device("cuda:0"), torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        require_fp8_device(torch.device("cuda:0"), torch.float32)
    require_fp8_device(torch.device("cpu"), torch.float32)  # the reference runs anything


def test_fp8_on_cuda_without_triton_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA FP8 linear quantizes its input with a Triton kernel: no triton, a load error."""
    import importlib.util

    from radixserve.model.fp8 import require_fp8_device

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a)
    )
    with pytest.raises(ValueError, match=r"need triton.*radixserve\[gpu\]"):
        require_fp8_device(torch.device("cuda:0"), torch.bfloat16)
    require_fp8_device(torch.device("cpu"), torch.bfloat16)  # the CPU reference needs none


def test_scaled_mm_call_agrees_with_the_reference_on_the_cpu() -> None:
    """The GPU path's `_scaled_mm` call (layouts, scale shapes, bias) runs on the CPU too:
    it agrees with the reference to bfloat16 rounding."""
    gen = torch.Generator().manual_seed(0)
    w, _ = quantize_rows(torch.randn(48, 64, generator=gen))
    scale = torch.rand(48, generator=gen) / 100 + 1e-3
    bias = torch.randn(48, generator=gen).bfloat16()
    for m in (1, 3, 17):
        x = torch.randn(2, m, 64, generator=gen).bfloat16()
        got = scaled_mm_linear(x, w, scale, bias)
        want = reference_linear(x, w, scale, bias)
        assert got.shape == want.shape == (2, m, 48) and got.dtype == torch.bfloat16
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


def test_fp8_experts_in_a_checkpoint_are_refused(tmp_path: Path, helpers: Any) -> None:
    from test_fp8 import to_compressed_tensors

    helpers.make_tiny_checkpoint("mixtral", tmp_path / "src")
    to_compressed_tensors(tmp_path / "src", tmp_path / "fp8", "channel", linears=("q_proj", "w1"))
    with pytest.raises(ValueError, match=r"FP8 tensor '.*experts\.0\.w1\.weight'.*not MoE experts"):
        load_model(str(tmp_path / "fp8"))


def test_fused_parts_must_agree(tmp_path: Path, helpers: Any) -> None:
    from test_fp8 import to_compressed_tensors

    helpers.make_tiny_checkpoint("llama3-rope", tmp_path / "src")
    to_compressed_tensors(tmp_path / "src", tmp_path / "fp8", "channel", linears=("q_proj", "o_proj"))
    with pytest.raises(ValueError, match=r"k_proj\.weight' .* is not FP8 while the other parts"):
        load_model(str(tmp_path / "fp8"))


def test_deterministic_mode_refuses_an_fp8_checkpoint(tmp_path: Path, helpers: Any) -> None:
    """An FP8 checkpoint is FP8 without `quantization="fp8"`: the deterministic mode's check of
    that option alone would let its linears run the FP8 product, which no batch-invariant kernel
    computes; the engine refuses it at start instead."""
    helpers.make_tiny_checkpoint("llama3-rope", tmp_path / "src")
    to_compressed_tensors(tmp_path / "src", tmp_path / "fp8", "channel")

    async def start() -> None:
        async with AsyncEngine(EngineConfig(model=str(tmp_path / "fp8"), device="cpu", deterministic=True)):
            pass

    with pytest.raises(ValueError, match=r"deterministic=True: .* is an FP8 checkpoint"):
        asyncio.run(start())
