"""`ForwardBatch`: everything one forward pass needs, built once per step.

A step holds B requests. Request i brings `extend_lens[i]` new tokens (1 for a
decoding request, more for a prefill or a prefill chunk) whose positions start
at `prefix_lens[i]`: its first `prefix_lens[i]` tokens already have K/V in the
pool (a radix-cache hit or an earlier chunk). Tokens are laid out flat,
request after request.

The KV layout is token-level (one slot per token): `kv_indices[kv_indptr[i]:
kv_indptr[i+1]]` are the slots of request i's whole context *after* this
step, in position order, so its last `extend_lens[i]` entries equal its part
of `out_slots`. This is FlashInfer's paged layout with page size 1, and the
torch and Triton backends read it the same way.

Host-side copies of the lengths travel with the batch (the scheduler knows
them without asking the device), so no backend needs a device-to-host sync.

`cascade` (decode steps only, optional): rows grouped by a shared context
prefix (runtime/cascade.py). A backend that supports it (`supports_cascade`)
reads each group's prefix once; one that does not ignores it, since
`kv_indices` always holds every row's whole context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.runtime.cascade import CascadeGroups

if TYPE_CHECKING:
    from radixserve.runtime.attention.tiling import DecodeTiling


@dataclass(frozen=True)
class GraphAttention:
    """The attention inputs of a graph-replayed extend step, in static device buffers.

    The step's leading one-token rows (decode rows come first) run the split-K
    decode kernel, the other rows the extend kernel over a tile table; both
    grids are fixed at capture, so the shape of the step lives in the buffers."""

    tiles: torch.Tensor  # [n, 2] int32: (request, block) per extend program; request -1: none
    decode_indptr: torch.Tensor  # [D + 1] int32: kv_indptr of rows < D, empty past the decode rows
    decode_tiling: DecodeTiling  # fixed at capture


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64: the KV slot each new token writes
    qo_indptr: torch.Tensor  # [B+1] int32: new tokens of request i are rows qo_indptr[i]:qo_indptr[i+1]
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [sum(seq_lens)] int32: context slots, request after request
    extend_lens: list[int]  # host copy, len B
    prefix_lens: list[int]  # host copy, len B
    # Rows of the flat token axis whose logits are wanted. None: the last new
    # token of each request (what sampling needs).
    logit_rows: torch.Tensor | None = None
    # Shared-prefix groups of a decode step (runtime/cascade.py); None: plain attention.
    cascade: CascadeGroups | None = None
    # Decode steps built on the device: each request's row (int64), which the sampler reuses.
    rows: torch.Tensor | None = None
    # Extend steps replayed from a CUDA graph (runtime/extend_graphs.py): what the kernels
    # read instead of a host plan; every backend then runs triton_extend.graph_attention.
    graph: GraphAttention | None = None

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def is_decode(self) -> bool:
        """Every request brings exactly one token (the decode kernels apply)."""
        return all(e == 1 for e in self.extend_lens)

    def last_token_rows(self) -> torch.Tensor:
        return (self.qo_indptr[1:] - 1).long()

    @staticmethod
    def build(
        input_ids: list[int] | torch.Tensor,
        extend_lens: list[int],
        prefix_lens: list[int],
        context_slots: list[torch.Tensor],
        device: torch.device | str = "cpu",
        logit_rows: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """Build a batch from per-request context slot lists (prefix + new).

        `context_slots[i]` has `prefix_lens[i] + extend_lens[i]` slots; its
        tail is where request i's new tokens are written. Convenience for
        tests and the model runner on the CPU; the GPU runner builds the
        same tensors from its request-to-slot table on the device.
        """
        device = torch.device(device)
        assert len(extend_lens) == len(prefix_lens) == len(context_slots)
        positions = torch.cat(
            [torch.arange(p, p + e, dtype=torch.int64) for p, e in zip(prefix_lens, extend_lens)]
        )
        out_slots = torch.cat([s[len(s) - e :].to(torch.int64) for s, e in zip(context_slots, extend_lens)])
        for s, p, e in zip(context_slots, prefix_lens, extend_lens):
            assert len(s) == p + e, "context_slots must hold prefix and new tokens"
        qo = torch.zeros(len(extend_lens) + 1, dtype=torch.int32)
        qo[1:] = torch.cumsum(torch.tensor(extend_lens, dtype=torch.int32), 0)
        kv = torch.zeros(len(extend_lens) + 1, dtype=torch.int32)
        kv[1:] = torch.cumsum(torch.tensor([len(s) for s in context_slots], dtype=torch.int32), 0)
        ids = torch.as_tensor(input_ids, dtype=torch.int64)
        return ForwardBatch(
            input_ids=ids.to(device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            qo_indptr=qo.to(device),
            kv_indptr=kv.to(device),
            kv_indices=torch.cat([s.to(torch.int32) for s in context_slots]).to(device),
            extend_lens=list(extend_lens),
            prefix_lens=list(prefix_lens),
            logit_rows=None if logit_rows is None else logit_rows.to(device),
        )
