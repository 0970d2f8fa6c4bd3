"""Loading errors name what is wrong: the missing file, the unsupported architecture, the
tensor whose shape does not fit, the missing weight."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve.model.loader import load_model
from radixserve.model.model_cache import build_once
from radixserve.model.registry import UnsupportedArchitectureError
from radixserve.model.weights import WeightLoadError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, helpers: Any) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    helpers.make_tiny_checkpoint("llama3-rope", folder)
    return folder


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite(folder: Path, edit: Any) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), {"format": "pt"})


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as err:
        load_model(str(missing))
    assert str(missing) in str(err.value)


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_model(str(tmp_path))
    assert str(tmp_path / "config.json") in str(err.value)


def test_folder_without_weights(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_model(str(folder))
    msg = str(err.value)
    assert str(folder) in msg and "model.safetensors" in msg and "model.safetensors.index.json" in msg


def test_missing_shard_is_named(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "m")
    weights = load_file(str(folder / "model.safetensors"))
    names = sorted(weights)
    half = len(names) // 2
    save_file({k: weights[k] for k in names[:half]}, str(folder / "part-1.safetensors"))
    index = {
        "weight_map": {
            k: ("part-1.safetensors" if i < half else "part-2.safetensors") for i, k in enumerate(names)
        }
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_model(str(folder))
    assert str(folder / "part-2.safetensors") in str(err.value)


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_model(str(tmp_path))
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg


def test_unknown_model_type_names_the_architecture(tmp_path: Path) -> None:
    config = {"architectures": ["FancyNewForCausalLM"], "model_type": "fancy_new"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_model(str(tmp_path))
    assert "FancyNewForCausalLM" in str(err.value)


def test_shape_mismatch_names_tensor_and_shapes(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "m")
    name = "model.layers.1.mlp.up_proj.weight"

    def corrupt(t: dict[str, torch.Tensor]) -> None:
        t[name] = torch.zeros(100, 64)

    _rewrite(folder, corrupt)
    with pytest.raises(WeightLoadError) as err:
        load_model(str(folder))
    msg = str(err.value)
    assert name in msg and "(160, 64)" in msg and "(100, 64)" in msg


def test_missing_weight_is_named(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "m")
    _rewrite(folder, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(WeightLoadError) as err:
        load_model(str(folder))
    assert "missing" in str(err.value) and "model.layers.0.self_attn.k_proj.weight" in str(err.value)


def test_unexpected_weight_is_named(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "m")

    def add_bias(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)

    _rewrite(folder, add_bias)
    with pytest.raises(WeightLoadError) as err:
        load_model(str(folder))
    assert "model.layers.0.self_attn.q_proj.bias" in str(err.value)


def test_unsupported_rope_type_is_named(checkpoint: Path, tmp_path: Path) -> None:
    folder = _copy(checkpoint, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_theta"] = 10000.0
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        load_model(str(folder))
    assert "dynamic" in str(err.value)


def test_bare_shape_name_suggests_dummy() -> None:
    with pytest.raises(ValueError) as err:
        load_model("llama-3.1-8b")
    assert "dummy:llama-3.1-8b" in str(err.value)


def test_unknown_names_list_what_is_known() -> None:
    with pytest.raises(ValueError) as err:
        load_model("dummy:gpt-5")
    assert "gpt-5" in str(err.value) and "qwen2.5-0.5b" in str(err.value)
    with pytest.raises(ValueError) as err:
        load_model("dummy:qwen3-0.6b", load_format="pickle")
    assert "pickle" in str(err.value)
    with pytest.raises(ValueError) as err:
        load_model("dummy:qwen3-0.6b", dtype=torch.float64)
    assert "float64" in str(err.value)


def test_build_once_is_atomic_under_concurrent_builders(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "thing"
    barrier = threading.Barrier(4)
    built: list[int] = []

    def build(tmp: Path) -> None:
        barrier.wait()  # every builder is inside its temp dir before any renames
        (tmp / "data.txt").write_text(str(threading.get_ident()))
        built.append(1)

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(build_once(final, build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [final] * 4 and len(built) == 4
    assert [p.name for p in final.parent.iterdir()] == ["thing"]  # the losers' temp dirs are gone
    assert (final / "data.txt").read_text().isdigit()


def test_build_once_failure_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "thing"

    def fail(tmp: Path) -> None:
        (tmp / "half-written").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        build_once(final, fail)
    assert list(tmp_path.iterdir()) == []
