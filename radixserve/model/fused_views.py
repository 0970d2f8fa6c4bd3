"""Fused projections that a safetensors file already stores in one piece.

A fused parameter (gate/up, q/k/v) whose checkpoint parts lie back to back in
one file, in the parameter's row order and with its dtype, is a view of that
file mapped privately (copy-on-write, read when first used), like the whole
parameters `safe_open` maps; no copy at start. safetensors writes tensors in
name order, so `mlp.gate_proj` and `mlp.up_proj` are neighbours; q/k/v are not
(`o_proj` lies between) and are still copied. The offsets come from the file's
header (8 bytes of length, then JSON), which `safe_open` does not expose.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

SAFETENSORS_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F8_E4M3": torch.float8_e4m3fn,
}


class PartTarget(Protocol):
    param: nn.Parameter
    rows: slice | None


def fused_views(targets: Mapping[str, PartTarget], files: list[Path]) -> dict[int, torch.Tensor]:
    """id(parameter) -> a view of the file holding all its parts, for the parameters that have one."""
    groups: dict[int, list[tuple[int, str]]] = {}  # fused parameter -> (first row, checkpoint name)
    params: dict[int, nn.Parameter] = {}
    for name, t in targets.items():
        if t.rows is not None and t.param.device.type == "cpu":
            groups.setdefault(id(t.param), []).append((t.rows.start or 0, name))
            params[id(t.param)] = t.param
    views: dict[int, torch.Tensor] = {}
    for path in files if groups else []:
        header, base = _header(path)
        storage: Any = None  # the file's private mapping, made on first need
        for pid, parts in groups.items():
            start = _span_start(params[pid], [header.get(name) for _, name in sorted(parts)])
            if pid in views or start is None:
                continue
            if storage is None:
                storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size)
            param = params[pid]
            offset, rem = divmod(base + start, param.element_size())
            if rem == 0:
                views[pid] = torch.empty(0, dtype=param.dtype).set_(
                    storage, offset, param.shape, param.stride()
                )
    return views


def _header(path: Path) -> tuple[dict[str, dict[str, object]], int]:
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return {}, 0  # not readable here: safe_open reports it while loading
    return (header, 8 + n) if isinstance(header, dict) else ({}, 0)


def _span_start(param: nn.Parameter, infos: list[object]) -> int | None:
    """Byte offset (in the data section) where the parts start, if they tile `param` exactly."""
    if not infos or not all(isinstance(i, dict) for i in infos) or not param.is_contiguous():
        return None
    spans: list[tuple[int, int]] = []
    for info in infos:
        assert isinstance(info, dict)
        if SAFETENSORS_DTYPES.get(info.get("dtype", "")) != param.dtype:
            return None
        lo, hi = info.get("data_offsets", (0, 0))
        spans.append((int(lo), int(hi)))
    if any(a[1] != b[0] for a, b in zip(spans, spans[1:], strict=False)):
        return None
    if spans[-1][1] - spans[0][0] != param.numel() * param.element_size():
        return None
    return spans[0][0]
