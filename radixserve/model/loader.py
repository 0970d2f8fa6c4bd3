"""`load_model`: from a spec string to a ready model, its config and its tokenizer.

A spec is one of
- a local Hugging Face folder (config.json, model.safetensors or shards with
  model.safetensors.index.json, tokenizer files);
- a `.gguf` file, converted once into a cached folder (see `gguf_convert`);
- `smollm2-135m-instruct` (alias `smollm2-135m`): the embedded default;
- `dummy:<shape>` (or any shape name or folder with `load_format="dummy"`):
  random weights for a named shape from `shapes`, no files needed.

FP8 (model/fp8.py, docs/fp8.md): a folder whose config.json has an FP8
`quantization_config` loads its FP8 linears as stored; `quantization="fp8"`
quantizes the decoder layers' linears of any other checkpoint (or dummy weights)
at load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from radixserve.cache.kv_quant import KVScales
from radixserve.model.config import ModelConfig, plain_hf_config
from radixserve.model.embedded import EMBEDDED_ALIASES, EmbeddedModelMissingError, embedded_model_dir
from radixserve.model.fp8 import (
    QUANTIZATIONS,
    check_fp8_shapes,
    prepare_fp8_checkpoint,
    quantize_model_,
    require_fp8_device,
)
from radixserve.model.gguf_convert import gguf_folder
from radixserve.model.quant_config import Fp8Checkpoint, read_quantization
from radixserve.model.registry import resolve_architecture
from radixserve.model.shapes import SHAPES, shape_hf_config, shape_names
from radixserve.model.tokenizer import eos_token_ids, load_tokenizer
from radixserve.model.weights import checkpoint_files, init_dummy_weights, load_checkpoint

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DUMMY_PREFIX = "dummy:"
DUMMY_SEED = 0


@dataclass(frozen=True)
class LoadedModel:
    model: nn.Module
    config: ModelConfig
    # A transformers config, or the folder whose config.json transformers reads on first use of
    # `hf_config` (loading never needs it: importing transformers' config machinery costs seconds).
    hf_config_source: Any
    tokenizer: Any | None  # a transformers tokenizer; None for dummy shapes without one
    path: str | None  # the HF folder the weights came from; None for dummy weights
    eos_token_ids: frozenset[int] = frozenset()
    quantization: str | None = None  # "fp8" when the decoder layers' linears are FP8
    # The checkpoint's per-layer K/V cache scales (`self_attn.k_scale` / `v_scale`), used by an
    # FP8 KV cache (`EngineConfig.kv_cache_dtype`); None: the checkpoint has none (1.0).
    kv_scales: KVScales | None = None

    @functools.cached_property
    def hf_config(self) -> Any:
        """The transformers config of the model (e.g. to build transformers' twin of it)."""
        if isinstance(self.hf_config_source, Path):
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(str(self.hf_config_source))
        return self.hf_config_source


def load_model(
    spec: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    load_format: str = "auto",
    quantization: str | None = None,
) -> LoadedModel:
    """`quantization="fp8"`: FP8 weights for the decoder layers' linears (see model/fp8.py);
    None: as the checkpoint stores them."""
    spec = os.fspath(spec)
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} is not one of {', '.join(LOAD_FORMATS)}")
    if dtype not in DTYPES:
        raise ValueError(
            f"dtype {dtype} is not supported (use torch.float32, torch.bfloat16 or torch.float16)"
        )
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not supported (use None or 'fp8')")
    device = torch.device(device)
    if quantization is not None:
        require_fp8_device(device, dtype)
    if spec.startswith(DUMMY_PREFIX) or (load_format == "dummy" and spec in SHAPES):
        loaded = _load_dummy_shape(spec.removeprefix(DUMMY_PREFIX), dtype, device)
    else:
        folder = _resolve_folder(spec, load_format)
        loaded = _load_folder(folder, dtype, device, dummy=load_format == "dummy")
    if quantization is not None and loaded.quantization is None:
        # An FP8 checkpoint stays as stored (its ignore list included).
        quantize_model_(loaded.model)
        loaded = dataclasses.replace(loaded, quantization=quantization)
    check_fp8_shapes(loaded.model, device)
    return loaded


def _resolve_folder(spec: str, load_format: str) -> Path:
    """The local HF folder that `spec` names, converting a GGUF file first."""
    if spec in EMBEDDED_ALIASES and not Path(spec).exists():
        return embedded_model_dir()
    path = Path(spec).expanduser()
    if path.is_file() and load_format != "safetensors" and (path.suffix == ".gguf" or load_format == "gguf"):
        return gguf_folder(path)
    if load_format == "gguf":
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path / 'config.json'} does not exist: expected a Hugging Face model folder "
                "(config.json, model.safetensors or shards with model.safetensors.index.json, "
                "tokenizer files)"
            )
        return path
    if spec in SHAPES:
        raise ValueError(
            f"{spec!r} is a model shape without weights; use {DUMMY_PREFIX + spec!r} "
            f"(or load_format='dummy') for random weights, or pass a local folder or .gguf file"
        )
    if path.exists():
        raise FileNotFoundError(f"{path} is neither a model folder nor a .gguf file")
    raise FileNotFoundError(
        f"model {spec!r} not found: no such folder or .gguf file ({path.resolve()}), and not a known name "
        f"({', '.join(sorted(EMBEDDED_ALIASES))}, or dummy:<shape> with shape in {', '.join(shape_names())})"
    )


def _model_config(hf_config: Any) -> tuple[type[nn.Module], ModelConfig]:
    arch, cls = resolve_architecture(
        getattr(hf_config, "architectures", None), getattr(hf_config, "model_type", None)
    )
    return cls, ModelConfig.from_hf(hf_config, architecture=arch)


def _instantiate(
    cls: type[nn.Module], config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> nn.Module:
    # Built directly on the target device with uninitialised storage: the weights are filled once, after.
    with torch.device(device):
        model = cls(config, dtype=dtype)
    return model.eval()


def _read_hf_config(folder: Path) -> tuple[Any, Any]:
    """(what `ModelConfig.from_hf` reads, the `hf_config_source`): config.json itself when
    it is plain enough (see `plain_hf_config`), else transformers' reading of it."""
    try:
        plain = plain_hf_config(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError):
        plain = None  # transformers reports what is wrong with the file
    if plain is not None:
        return plain, folder
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(str(folder))
    except (ValueError, KeyError) as e:
        # An unknown model_type fails inside transformers; say which architecture it was.
        raise _unreadable_config(folder, e) from e
    return hf_config, hf_config


def _checkpoint_quantization(folder: Path) -> Fp8Checkpoint | None:
    """The FP8 layout config.json declares (refusing other quantized checkpoints), or None."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None  # `_read_hf_config` reports it
    return read_quantization(raw) if isinstance(raw, dict) else None


def _load_folder(folder: Path, dtype: torch.dtype, device: torch.device, dummy: bool) -> LoadedModel:
    hf_config, hf_source = _read_hf_config(folder)
    cls, config = _model_config(hf_config)
    quant = None if dummy else _checkpoint_quantization(folder)
    files = None if dummy else checkpoint_files(folder)  # fail on missing files before building
    if quant is not None:
        require_fp8_device(device, dtype, quant.weight_block)
    model = _instantiate(cls, config, dtype, device)
    if quant is not None and files is not None:
        prepare_fp8_checkpoint(model, files, quant.weight_block)
    # The tokenizer loads in a thread while the weights are copied: parsing tokenizer.json
    # holds the GIL, torch's copies release it, so the two overlap only from here on
    # (started before `_instantiate`, it would stall that Python code instead).
    with ThreadPoolExecutor(1, thread_name_prefix="radixserve-tokenizer") as pool:
        pending = pool.submit(load_tokenizer, folder)
        kv_scales = None
        if files is None:
            init_dummy_weights(model, seed=DUMMY_SEED, embed_scale=config.embed_scale)
        else:
            kv_scales = load_checkpoint(
                model, files, tied=config.tie_word_embeddings, quant=quant, num_layers=config.num_layers
            )
        tokenizer = pending.result()
    return LoadedModel(
        model=model,
        config=config,
        hf_config_source=hf_source,
        tokenizer=tokenizer,
        path=None if dummy else str(folder),
        eos_token_ids=eos_token_ids(config.eos_token_ids, tokenizer, folder),
        quantization=None if quant is None else "fp8",
        kv_scales=kv_scales,
    )


def _load_dummy_shape(name: str, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known shapes: {', '.join(shape_names())}")
    hf_config = shape_hf_config(name)
    cls, config = _model_config(hf_config)
    model = _instantiate(cls, config, dtype, device)
    init_dummy_weights(model, seed=DUMMY_SEED, embed_scale=config.embed_scale)
    tokenizer = None
    if name in EMBEDDED_ALIASES:
        # The embedded model has this shape: its tokenizer makes the dummy usable with text.
        with contextlib.suppress(EmbeddedModelMissingError):
            tokenizer = load_tokenizer(embedded_model_dir())
    return LoadedModel(
        model=model,
        config=config,
        hf_config_source=hf_config,
        tokenizer=tokenizer,
        path=None,
        eos_token_ids=eos_token_ids(config.eos_token_ids, tokenizer, None),
    )


def _unreadable_config(folder: Path, error: Exception) -> Exception:
    from radixserve.model.registry import UnsupportedArchitectureError, supported_architectures

    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        raw = {}
    archs = raw.get("architectures") or []
    if archs and not any(a in supported_architectures() for a in archs):
        return UnsupportedArchitectureError(
            f"unsupported model architecture: {', '.join(archs)} (in {folder / 'config.json'}); "
            f"supported: {', '.join(supported_architectures())}"
        )
    return ValueError(f"cannot read {folder / 'config.json'}: {error}")
