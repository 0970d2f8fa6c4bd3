"""A checkpoint's FP8 KV cache scales (model/kv_scales.py): read per layer under either
naming, handed to an FP8 pool, ignored by a cache in the model dtype, refused when partial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve import EngineConfig
from radixserve.engine_build import kv_pool_config
from radixserve.model.loader import load_model


def _with_scales(folder: Path, names: dict[str, float]) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    tensors.update({n: torch.tensor(v) for n, v in names.items()})
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("style", ["self_attn", "output_scale"])
def test_checkpoint_kv_scales_reach_the_fp8_pool(tmp_path: Path, helpers: Any, style: str) -> None:
    hf = helpers.make_tiny_checkpoint("mistral", tmp_path)
    layers = hf.config.num_hidden_layers
    k_name = "self_attn.k_scale" if style == "self_attn" else "self_attn.k_proj.output_scale"
    v_name = "self_attn.v_scale" if style == "self_attn" else "self_attn.v_proj.output_scale"
    scales = {f"model.layers.{i}.{k_name}": 0.5 + i for i in range(layers)}
    scales |= {f"model.layers.{i}.{v_name}": 0.25 * (i + 1) for i in range(layers)}
    _with_scales(tmp_path, scales)
    loaded = load_model(tmp_path)
    assert loaded.kv_scales is not None
    assert loaded.kv_scales.k == tuple(0.5 + i for i in range(layers))
    assert loaded.kv_scales.v == tuple(0.25 * (i + 1) for i in range(layers))
    cpu = torch.device("cpu")
    fp8 = kv_pool_config(EngineConfig(kv_cache_dtype="fp8_e4m3"), loaded, torch.float32, cpu)
    assert fp8.fp8 and fp8.k_scale(1) == 1.5 and fp8.v_scale(0) == 0.25
    plain = kv_pool_config(EngineConfig(), loaded, torch.float32, cpu)
    assert not plain.fp8 and plain.k_scales == () and plain.dtype == torch.float32


def test_checkpoint_without_kv_scales_reads_none(tmp_path: Path, helpers: Any) -> None:
    helpers.make_tiny_checkpoint("mistral", tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.kv_scales is None
    fp8 = kv_pool_config(EngineConfig(kv_cache_dtype="fp8_e4m3"), loaded, torch.float32, torch.device("cpu"))
    assert fp8.k_scale(0) == 1.0 == fp8.v_scale(0)


def test_partial_kv_scales_are_refused(tmp_path: Path, helpers: Any) -> None:
    helpers.make_tiny_checkpoint("mistral", tmp_path)
    _with_scales(tmp_path, {"model.layers.0.self_attn.k_scale": 1.0, "model.layers.0.self_attn.v_scale": 1.0})
    with pytest.raises(ValueError, match=r"k_scale for layers \[1"):
        load_model(tmp_path)
