"""The sparse (mixture-of-experts) feed-forward block: Mixtral, Qwen2-MoE, Qwen3-MoE.

A router (`gate`) scores every expert per token; softmax in float32, the top-k
kept (renormalised to sum to one where the config says so), each token runs
through its k experts' gated MLPs and their outputs add up by weight. Qwen2-MoE
adds a shared expert every token takes, scaled by a sigmoid gate.

The experts' weights are stacked, `gate_up_proj [E, 2I, H]` and
`down_proj [E, H, I]` (transformers' own layout and what a fused GPU kernel
reads); the loader copies each checkpoint expert into its rows. On the CPU the
forward is the reference: transformers' loop over the experts that got a token,
in expert order, so float32 results match it; it asks the host which experts
were hit, per layer. On CUDA it is two grouped GEMMs over the pairs sorted by
expert (runtime/fused_moe.py), with no host sync, so CUDA graphs replay it.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.model.config import ModelConfig
from radixserve.model.layers import Linear, MatmulUser, frozen_param
from radixserve.model.options import MoEConfig
from radixserve.runtime.kernels import TORCH_KERNELS, TorchKernels


class MoEExperts(MatmulUser):
    kernels: TorchKernels = TORCH_KERNELS

    def __init__(self, moe: MoEConfig, hidden_size: int, activation: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.moe = moe
        self.activation = activation
        size = moe.intermediate_size
        self.gate_up_proj = frozen_param(moe.num_experts, 2 * size, hidden_size, dtype=dtype)
        self.down_proj = frozen_param(moe.num_experts, hidden_size, size, dtype=dtype)

    def checkpoint_parts(self) -> list[tuple[str, str, int, slice | None]]:
        """(checkpoint name under this module, our parameter, expert, its rows) per tensor."""
        gate, up, down = self.moe.expert_names
        size = self.moe.intermediate_size
        parts: list[tuple[str, str, int, slice | None]] = []
        for e in range(self.moe.num_experts):
            parts.append((f"{e}.{gate}.weight", "gate_up_proj", e, slice(0, size)))
            parts.append((f"{e}.{up}.weight", "gate_up_proj", e, slice(size, 2 * size)))
            parts.append((f"{e}.{down}.weight", "down_proj", e, None))
        return parts

    def forward(self, x: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        """x `[T, H]`; top_idx / top_w `[T, k]`: each token's experts and their weights."""
        if x.is_cuda:
            from radixserve.runtime.fused_moe import fused_moe  # imports triton: CUDA only

            return fused_moe(x, top_idx, top_w, self.gate_up_proj, self.down_proj, self._act_and_mul)
        return self.reference(x, top_idx, top_w)

    def reference(self, x: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        """transformers' loop over the experts hit (a host sync per call)."""
        out = torch.zeros_like(x)
        hit = torch.zeros(self.moe.num_experts, dtype=torch.bool, device=x.device)
        hit[top_idx.flatten()] = True
        for e in hit.nonzero()[:, 0].tolist():
            tokens, slot = torch.where(top_idx == e)
            h = self.matmul.linear(x[tokens], self.gate_up_proj[e])
            h = self._act_and_mul(h)
            h = self.matmul.linear(h, self.down_proj[e]) * top_w[tokens, slot, None]
            out.index_add_(0, tokens, h.to(out.dtype))
        return out

    def _act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.activation == "gelu_tanh":
            return self.kernels.gelu_tanh_and_mul(gate_up)
        return self.kernels.silu_and_mul(gate_up)


class SparseMoE(nn.Module):
    """One layer's sparse block; its parameters carry the checkpoint's names under the block."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, shared: nn.Module | None) -> None:
        super().__init__()
        assert config.moe is not None
        self.moe = config.moe
        self.gate = Linear(config.hidden_size, self.moe.num_experts, bias=False, dtype=dtype)
        self.experts = MoEExperts(self.moe, config.hidden_size, config.activation, dtype)
        # Qwen2-MoE: a dense MLP every token takes, and its sigmoid gate.
        self.shared_expert = shared
        self.shared_expert_gate = (
            Linear(config.hidden_size, 1, bias=False, dtype=dtype) if shared is not None else None
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k expert ids, their weights) per token, as transformers' routers compute them
        (on CUDA in one kernel, runtime/moe_route.py)."""
        logits = self.gate(x)
        if logits.is_cuda:
            from radixserve.runtime.moe_route import route_topk  # imports triton: CUDA only

            return route_topk(logits, self.moe.top_k, self.moe.renormalize)
        return self.route_logits(logits, self.moe.top_k, self.moe.renormalize)

    @staticmethod
    def route_logits(
        logits: torch.Tensor, top_k: int, renormalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference: softmax in float32, top-k, renormalised where asked, cast back."""
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_w, top_idx = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_idx, top_w.to(logits.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_idx, top_w = self.route(x)
        out = self.experts(x, top_idx, top_w)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            shared = self.shared_expert(x)
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out
