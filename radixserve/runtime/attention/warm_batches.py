"""Tiny steps that run each kind of attention step once at start-up, so that its kernels are
built before the first request (runtime/warm_up.py).

Every slot of these batches is the pool's last one: the engine's scratch slot, which no request
owns (the pool has one slot beyond what the allocator hands out). A warm-up step writes the K/V
of its tokens there first, so it reads only what it wrote.
"""

from __future__ import annotations

from functools import partial

import torch

from radixserve.runtime.attention.base import AttentionBackend, LayerOptions
from radixserve.runtime.attention.rope import Rope
from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.kernels import TORCH_KERNELS
from radixserve.runtime.warm_up import KernelBuild, StepKind, dtype_name

# (prefix, new tokens) per request: a prefill chunk after a cached prefix and a fresh prompt;
# decode rows of unequal contexts, rows 1 and 2 sharing a 3-token prefix in a cascade step.
EXTEND = ((3, 5), (0, 2))
DECODE = ((4, 1), (6, 1), (6, 1))
CASCADE = CascadeGroups(rows=((1, 2),), prefix_lens=(3,))
WARM_POSITIONS = 16  # rows of the warm-up's rotary tables: past every position above


def tiny_batch(backend: AttentionBackend, step: StepKind) -> ForwardBatch:
    """A batch of `step`'s kind ("extend", "decode" or "cascade") over the scratch slot."""
    shape = EXTEND if step == "extend" else DECODE
    device = torch.device(backend.pool.config.device)
    slot = torch.tensor([backend.pool.num_slots - 1], dtype=torch.int64)
    batch = ForwardBatch.build(
        [0] * sum(e for _, e in shape),
        [e for _, e in shape],
        [p for p, _ in shape],
        [slot.expand(p + e) for p, e in shape],
        device,
    )
    if step == "cascade":
        batch.cascade = CASCADE
    return batch


def run_step(backend: AttentionBackend, step: StepKind, layer: int) -> None:
    """Plan a tiny `step` and run `layer`'s attention over it."""
    batch = tiny_batch(backend, step)
    cfg = backend.pool.config
    with torch.inference_mode():
        backend.plan(batch)
        q = torch.zeros(
            batch.num_tokens, backend.num_heads, backend.head_dim, dtype=cfg.dtype, device=cfg.device
        )
        kv = torch.zeros(
            batch.num_tokens, backend.num_kv_heads, backend.head_dim, dtype=cfg.dtype, device=cfg.device
        )
        # With rotary over the whole head: the model's steps run the writer's fused rope + store,
        # not the plain store (a partial rotary builds its variant in the runner's tiny model step).
        table = torch.zeros(WARM_POSITIONS, backend.head_dim // 2, dtype=torch.float32, device=cfg.device)
        backend.forward(q, kv, kv, layer, batch, Rope(table, table, TORCH_KERNELS.rope))


def shape_label(backend: AttentionBackend) -> str:
    """ "bf16 head_dim 128": what a module is compiled for."""
    return f"{dtype_name(backend.pool.config.dtype)} head_dim {backend.head_dim}"


def per_layer_option(backend: AttentionBackend, name: str, step: StepKind) -> list[KernelBuild]:
    """One build of `step` per distinct layer option (a window or a soft-cap is a kernel variant),
    each run on the first layer that has it; `name`: the kernel's, for the label."""
    first: dict[LayerOptions, int] = {}
    for i, opts in enumerate(backend.layer_options):
        first.setdefault(opts, i)
    return [
        KernelBuild(
            f"{name} {shape_label(backend)}{_options_label(opts)}",
            partial(run_step, backend, step, layer),
            step,
        )
        for opts, layer in first.items()
    ]


def _options_label(opts: LayerOptions) -> str:
    parts = [f"window {opts.window}"] if opts.window is not None else []
    if opts.softcap is not None:
        parts.append(f"softcap {opts.softcap:g}")
    return f" ({', '.join(parts)})" if parts else ""
