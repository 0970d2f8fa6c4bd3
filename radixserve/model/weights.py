"""Filling a built model's parameters: from safetensors checkpoints, or with dummy values.

Checkpoint tensors are streamed one at a time with `safe_open` (never the
whole file in memory), renamed to ours (q/k/v and gate/up land in their rows
of the fused projections, each expert in its slice of the stacked expert
weights), shape-checked and copied, casting to the model's
dtype and device. A whole CPU parameter of the checkpoint's dtype is not
copied: it keeps the tensor `safe_open` maps from the file (private,
copy-on-write), so pages are read once, when first used, instead of copied
into fresh memory at start; nor is a fused one whose parts the file stores back to
back (gate/up: see `fused_views`). The copies that remain (q/k/v rows) run
on one intra-op thread: on a small shared CPU, torch's parallel copy spends most of
its time waiting for a busy core (measured 2-core, loaded: 1.4 s against 0.05 s).
Every problem is an error that names the tensor and file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from radixserve.cache.kv_quant import KVScales
from radixserve.model.fused_views import fused_views
from radixserve.model.kv_scales import KVScaleReader
from radixserve.model.layers import FusedLinear, Linear, RMSNorm, VocabEmbedding
from radixserve.model.moe import MoEExperts
from radixserve.model.quant_config import Fp8Checkpoint

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightLoadError(ValueError):
    pass


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a Hugging Face model folder, shards in index order."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"checkpoint shard {f} is missing (listed in {index})")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        return [single]
    others = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.safetensors")
    )
    found = f"; found only {', '.join(others)}" if others else ""
    raise FileNotFoundError(
        f"no weights in {folder}: expected {SINGLE_FILE} or {INDEX_FILE} with its shards{found}"
    )


def iter_checkpoint(files: list[Path]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield path, name, f.get_tensor(name)


class _Target:
    """Where one checkpoint tensor goes: a whole parameter, one part's rows of a fused
    one, or one expert's slice (and rows) of a stacked one; `module` owns the parameter."""

    def __init__(
        self, module: nn.Module, param: nn.Parameter, rows: slice | None, expert: int | None = None
    ) -> None:
        self.module = module
        self.param = param
        self.rows = rows
        self.expert = expert

    def view(self) -> torch.Tensor:
        t = self.param.data if self.expert is None else self.param.data[self.expert]
        return t if self.rows is None else t[self.rows]


def _targets(model: nn.Module) -> dict[str, _Target]:
    """Checkpoint name -> destination, for every tensor the model expects."""
    packed: dict[str, tuple[str, str]] = getattr(model, "packed_modules", {})
    renames: dict[str, str] = getattr(model, "module_renames", {})
    unpacked = {(fused, part): hf for hf, (fused, part) in packed.items()}
    targets: dict[str, _Target] = {}
    for mod_name, module in model.named_modules():
        hf_mod = ".".join(renames.get(part, part) for part in mod_name.split("."))
        if isinstance(module, MoEExperts):
            for name, p_name, expert, rows in module.checkpoint_parts():
                targets[f"{hf_mod}.{name}"] = _Target(module, getattr(module, p_name), rows, expert)
            continue
        for p_name, param in module.named_parameters(recurse=False):
            if isinstance(module, FusedLinear) and unpacked:
                prefix, _, fused = hf_mod.rpartition(".")
                for part in module.part_sizes:
                    hf_name = f"{prefix}.{unpacked[(fused, part)]}.{p_name}"
                    rows = module.scale_rows(part) if p_name == "weight_scale" else module.part_rows(part)
                    targets[hf_name] = _Target(module, param, rows)
            else:
                targets[f"{hf_mod}.{p_name}"] = _Target(module, param, None)
    return targets


def checkpoint_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Checkpoint tensor name -> the module whose parameter it fills."""
    return {name: t.module for name, t in _targets(model).items()}


def checkpoint_views(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under checkpoint (Hugging Face) names, as views: the
    inverse of loading. Lets transformers run on exactly our weights (the GPU
    suite's peer uses it for dummy shapes)."""
    return {name: t.view() for name, t in _targets(model).items()}


def _ignored(name: str, tied: bool) -> bool:
    # Old Llama checkpoints store rope buffers; tied checkpoints may repeat the embedding.
    return name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")


@contextlib.contextmanager
def _one_cpu_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def load_checkpoint(
    model: nn.Module, files: list[Path], tied: bool, quant: Fp8Checkpoint | None = None, num_layers: int = 0
) -> KVScales | None:
    """Fill `model` from `files`; with `quant`, its FP8 linears (`Linear.to_fp8`) take the
    checkpoint's FP8 weights and scales (see `_checkpoint_tensors`). Returns the checkpoint's
    KV cache scales for `num_layers` layers (model/kv_scales.py), None without any."""
    kv = KVScaleReader(num_layers)
    with _one_cpu_thread():
        _load_checkpoint(model, files, tied, quant, kv)
    return kv.scales()


def _checkpoint_tensors(
    files: list[Path], quant: Fp8Checkpoint | None, targets: dict[str, _Target]
) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """The checkpoint's tensors under our names: an FP8 weight's scale as `weight_scale`
    in its linear's stored layout (`Linear.checkpoint_scale`: a float32 per output row, a
    per-tensor one expanded at the copy, so the rows of a fused projection keep each part's
    own; or block scales); static activation scales left out."""
    for path, name, tensor in iter_checkpoint(files):
        if quant is None:
            yield path, name, tensor
            continue
        module, _, leaf = name.rpartition(".")
        if leaf in quant.skipped:
            continue
        if leaf == quant.scale_name:
            name = f"{module}.weight_scale"
            target = targets.get(name)
            owner = None if target is None else target.module
            tensor = owner.checkpoint_scale(tensor) if isinstance(owner, Linear) else tensor.float()
        yield path, name, tensor


def _load_checkpoint(
    model: nn.Module, files: list[Path], tied: bool, quant: Fp8Checkpoint | None, kv: KVScaleReader
) -> None:
    targets = _targets(model)
    # Fused parameters stored in one piece: not copied (stacked experts are).
    in_file = fused_views({n: t for n, t in targets.items() if t.expert is None}, files)
    loaded: set[str] = set()
    for path, name, tensor in _checkpoint_tensors(files, quant, targets):
        if _ignored(name, tied) or kv.take(name, tensor):
            continue
        target = targets.get(name)
        if target is None:
            raise WeightLoadError(
                f"unexpected weight {name!r} in {path}: "
                f"{type(model).__name__} with this config has no such tensor"
            )
        dst = target.view()
        if name.endswith(".weight_scale") and tensor.numel() == 1 and dst.dim() == 1:
            tensor = tensor.expand(dst.shape)  # per tensor -> per row
        if tuple(tensor.shape) != tuple(dst.shape):
            raise WeightLoadError(
                f"shape mismatch for weight {name!r} in {path}: expected {tuple(dst.shape)}, "
                f"got {tuple(tensor.shape)}"
            )
        if target.rows is None and target.expert is None and _same_layout(tensor, dst):
            target.param.data = tensor  # the file's mapped pages: no copy
        elif id(target.param) not in in_file:
            dst.copy_(tensor)
        loaded.add(name)
    for t in targets.values():
        if id(t.param) in in_file:
            t.param.data = in_file[id(t.param)]
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        where = files[0].parent
        raise WeightLoadError(f"missing weights in {where}: {shown}")


def _same_layout(src: torch.Tensor, dst: torch.Tensor) -> bool:
    return src.device == dst.device and src.dtype == dst.dtype and src.is_contiguous()


@torch.no_grad()
def init_dummy_weights(
    model: nn.Module, seed: int = 0, std: float = 0.02, embed_scale: float | None = None
) -> None:
    """Deterministic random weights on the parameters' own device (no CPU init and copy).

    Norm weights scale by 1 and everything else is N(0, std), so activations keep a
    sane scale through any depth and benchmark kernels see realistic values. With an
    `embed_scale` (Gemma multiplies embeddings by sqrt(hidden)) the embeddings are drawn
    with std / embed_scale: at std, an input token's scaled embedding stays large in the
    last hidden state, and the tied lm_head reads it back, so the model only repeated
    its input token (a 17-nat lead for 4 layers of gemma-2-9b's shape).
    """
    params = list(model.parameters())
    if not params:
        return
    generator = torch.Generator(device=params[0].device)
    generator.manual_seed(seed)
    norms = {id(m.weight): m.unit_weight for m in model.modules() if isinstance(m, RMSNorm)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, VocabEmbedding)}
    for param in params:
        if id(param) in norms:
            param.fill_(norms[id(param)])
        elif id(param) in embeddings and embed_scale is not None:
            param.normal_(0.0, std / embed_scale, generator=generator)
        else:
            param.normal_(0.0, std, generator=generator)
