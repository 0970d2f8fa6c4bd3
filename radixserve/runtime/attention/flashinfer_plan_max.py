"""FlashInfer's `plan()` without its per-request Python `max()`.

The `plan()` of FlashInfer's decode (tensor-core path) and prefill wrappers
(flashinfer 0.3.x) takes `max(lengths_tensor).item()` with Python's builtin
over a torch tensor: one `select` + compare + `.item()` per request, about
1 ms of host time per decode step at batch 256 on the H200 and twice that
per mixed step (benchmarks/profile_decode.py on the H200, 2026-12-01). Every plan of the
backend, graph and eager, goes through those wrappers, so the fix is made
there once: the modules' global `max` shadows the builtin for their own code
only, with `t.max()` (the same 0-d tensor, one op) for a non-empty 1-D
tensor and the builtin for anything else, so results are identical.
"""

from __future__ import annotations

import builtins
from types import ModuleType
from typing import Any

import torch


def _tensor_max(*args: Any, **kwargs: Any) -> Any:  # Any: as untyped as the builtin it stands for
    """builtins.max, except for one non-empty 1-D tensor: `t.max()`, the same 0-d tensor
    that iterating would pick, in one op instead of one per element."""
    if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
        t = args[0]
        if t.dim() == 1 and t.numel():
            return t.max()
    return builtins.max(*args, **kwargs)


def speed_up_plans(flashinfer: ModuleType) -> None:
    """Point `max` in flashinfer.prefill and flashinfer.decode at `_tensor_max`."""
    for name in ("prefill", "decode"):
        module = getattr(flashinfer, name, None)
        if module is not None and getattr(module, "max", None) is not _tensor_max:
            module.max = _tensor_max
