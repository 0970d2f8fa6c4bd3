"""Shared-prefix (cascade) decode in plain PyTorch: the reference for the FlashInfer path.

Level 0 attends each group's queries to the group's shared prefix, read once
for the group; level 1 attends every row to the rest of its context (a padded
batch, as plain decode does); the two merge through their log-sum-exp
(`merge_lse`). Computed in float32, so on the CPU it equals plain attention
to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixserve.runtime.cascade import CascadeGroups, cascade_indices, merge_lse
from radixserve.runtime.forward_batch import ForwardBatch


@dataclass
class TorchCascadePlan:
    groups: list[tuple[torch.Tensor, torch.Tensor]]  # per group: (rows int64, shared prefix slots int64)
    suffix_slots: torch.Tensor  # [B, L] int64: each row's context after its shared prefix, padded
    suffix_valid: torch.Tensor  # [B, L] bool


def plan_cascade(batch: ForwardBatch, groups: CascadeGroups) -> TorchCascadePlan:
    idx = cascade_indices(batch.kv_indices, batch.seq_lens, groups)
    device = batch.kv_indices.device
    prefix = idx.prefix_indices.long()
    per_group: list[tuple[torch.Tensor, torch.Tensor]] = []
    off = 0
    for rows, p in zip(groups.rows, groups.prefix_lens):
        per_group.append((torch.tensor(rows, dtype=torch.int64, device=device), prefix[off : off + p]))
        off += p
    lens = torch.tensor(idx.suffix_lens, device=device)
    cols = torch.arange(max(idx.suffix_lens), device=device)[None, :]
    valid = cols < lens[:, None]
    starts = torch.cumsum(lens, 0)[:, None] - lens[:, None]
    pos = torch.where(valid, starts + cols, torch.zeros_like(cols))
    return TorchCascadePlan(per_group, idx.suffix_indices.long()[pos], valid)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention with its log-sum-exp, GQA by head groups.

    q `[B, n, Hq, D]`, k/v `[B, L, Hkv, D]`, valid `[B, L]` (keys to use) ->
    output `[B, n, Hq, D]` and natural-log lse `[B, n, Hq]`, in float32.
    """
    b, n, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    # Query head h uses KV head h // g: lay each KV head's g query heads and n tokens as rows.
    qg = q.float().view(b, n, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * n, d)
    s = torch.matmul(qg, k.float().permute(0, 2, 3, 1)) * scale  # [B, Hkv, g*n, L]
    if valid is not None:
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B, Hkv, g*n]
    o = torch.matmul(torch.exp(s - lse[..., None]), v.float().transpose(1, 2))  # [B, Hkv, g*n, D]
    o = o.view(b, hkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(b, n, hq, d)
    return o, lse.view(b, hkv, g, n).permute(0, 3, 1, 2).reshape(b, n, hq)


KVRead = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def cascade_forward(q: torch.Tensor, plan: TorchCascadePlan, scale: float, read: KVRead) -> torch.Tensor:
    """q `[B, Hq, D]` (one token per row) over the layer's K/V, which `read(slots)` gathers
    (dequantized from an FP8 pool) -> `[B, Hq, D]`."""
    k, v = read(plan.suffix_slots)
    out, lse = attend(q[:, None], k, v, scale, plan.suffix_valid)
    out, lse = out[:, 0], lse[:, 0]  # [B, Hq, D], [B, Hq]
    for rows, prefix in plan.groups:  # the shared prefix: read once for the group's m queries
        k0, v0 = read(prefix)
        o0, l0 = attend(q[rows][None], k0[None], v0[None], scale)
        out[rows], lse[rows] = merge_lse(out[rows], lse[rows], o0[0], l0[0])
    return out.to(q.dtype)
