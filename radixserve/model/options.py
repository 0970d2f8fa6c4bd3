"""The parts of a `ModelConfig` that are configs themselves: rope, sparse blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A rope parameter: a number, a name, or LongRoPE's per-frequency factors (a tuple, so
# the config stays hashable).
RopeValue = float | int | bool | str | tuple[float, ...] | None


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    type: str = "default"
    # The scaling fields (factor, low_freq_factor, original_max_position_embeddings, ...),
    # sorted by name.
    params: tuple[tuple[str, RopeValue], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """transformers 5's `rope_parameters` layout."""
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in self.params}
        return {"rope_theta": self.theta, "rope_type": self.type, **params}


@dataclass(frozen=True)
class MoEConfig:
    """The sparse feed-forward blocks: a router picks `top_k` of `num_experts` per token."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of each expert
    # Per layer: a sparse block (True) or the dense MLP of `ModelConfig.intermediate_size`
    # (Qwen's `decoder_sparse_step` and `mlp_only_layers`).
    sparse_layers: tuple[bool, ...]
    # The top-k softmax weights rescaled to sum to one (Mixtral always; Qwen's `norm_topk_prob`).
    renormalize: bool
    # A dense expert every token takes, weighted by sigmoid(shared_expert_gate) (Qwen2-MoE); 0: none.
    shared_expert_size: int = 0
    # Checkpoint names: of the block in a layer, and of each expert's gate, up, down projections.
    block_name: str = "mlp"
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    experts_field: str = "num_experts"  # the config field that gave `num_experts`, for messages
