"""Re-planning a CUDA-graph decode wrapper without FlashInfer's per-call Python.

`BatchDecodeWithPagedKVCacheWrapper.plan` (flashinfer 0.3.x, tensor-core path)
takes `max()` of the per-request lengths with Python's builtin over a torch
tensor: one `select` + compare + `.item()` per request, about 1 ms of host
time per step at batch 256 on the H200 (profile in BENCHMARKS.md), plus
small pinned tensors built per call. For a graph state the kernel, the
buffers and every option are fixed at capture; a step only changes the page
table and the schedule. So after the official `plan()` has run once (at
capture), `FastGraphDecodePlan.plan` does just that: copies the indptr
(from a pinned buffer of this state) and the indices into the wrapper's
fixed buffers and calls the compiled module's `plan` with host arrays,
exactly as the official method does in graph mode. This is the approach of
SGLang's `fast_decode_plan`; it reads the wrapper's private fields, so it is
used only where they are all present (`supported`), else the official plan.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np
import torch

_FIELDS = (
    "_cached_module",
    "_float_workspace_buffer",
    "_int_workspace_buffer",
    "_pin_memory_int_workspace_buffer",
    "_paged_kv_indptr_buf",
    "_paged_kv_indices_buf",
)


class FastGraphDecodePlan:
    def __init__(self, wrapper: Any, batch_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int):
        self.w = wrapper
        self.batch_size = batch_size
        self.heads = (num_qo_heads, num_kv_heads)
        self.head_dim = head_dim
        self.qo_indptr = torch.arange(batch_size + 1, dtype=torch.int32)  # one query per row
        # Pinned: the copy to the device is queued without waiting (the caller's plan guard
        # keeps this buffer from being rewritten before that copy ran).
        self.indptr = torch.zeros(batch_size + 1, dtype=torch.int32).pin_memory()
        self.kv_lens = torch.zeros(batch_size, dtype=torch.int32)

    @staticmethod
    def supported(wrapper: Any) -> bool:
        """A tensor-core graph wrapper that the official plan has set up once."""
        return (
            bool(getattr(wrapper, "use_tensor_cores", False))
            and bool(getattr(wrapper, "is_cuda_graph_enabled", False))
            and all(getattr(wrapper, f, None) is not None for f in _FIELDS)
        )

    def plan(self, seq_lens: list[int], indices: torch.Tensor) -> None:
        """Plan for rows of `seq_lens` context slots whose slots are `indices` (device)."""
        w, bs = self.w, self.batch_size
        lens = np.asarray(seq_lens, dtype=np.int32)
        self.kv_lens.numpy()[:] = lens
        np.cumsum(lens, out=self.indptr.numpy()[1:])
        w._paged_kv_indptr_buf.copy_(self.indptr, non_blocking=True)
        w._paged_kv_indices_buf[: len(indices)].copy_(indices, non_blocking=True)
        # The last-page-length buffer holds ones (page size 1) since the first plan.
        w._plan_info = w._cached_module.plan(
            w._float_workspace_buffer,
            w._int_workspace_buffer,
            w._pin_memory_int_workspace_buffer,
            self.qo_indptr,
            self.indptr,
            self.kv_lens,
            bs,  # total query rows
            bs,
            *self.heads,
            1,  # page size
            True,  # CUDA-graph mode: fixed offsets, as captured
            self.head_dim,
            self.head_dim,
            False,  # causal
        )


def _tensor_max(*args: Any, **kwargs: Any) -> Any:
    """builtins.max, except for one non-empty 1-D tensor: `t.max()`, the same 0-d tensor
    that iterating would pick, in one op instead of one per element."""
    if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
        t = args[0]
        if t.dim() == 1 and t.numel():
            return t.max()
    return builtins.max(*args, **kwargs)


def speed_up_plans(flashinfer: Any) -> None:
    """Make the `plan()` of FlashInfer's wrappers take `max()` of a length tensor in one op.

    Eager steps (mixed prefill + decode, cascade levels) still use the official plans,
    whose `max(lengths_tensor).item()` costs a select + compare + sync-free `.item()`
    per request (about 2 ms per mixed step at 256 rows). The modules' global `max`
    shadows the builtin for their own code only; results are identical.
    """
    for name in ("prefill", "decode"):
        module = getattr(flashinfer, name, None)
        if module is not None and getattr(module, "max", None) is not _tensor_max:
            module.max = _tensor_max
