"""The decoder-only model over a paged KV pool, for every supported family.

Llama 2/3/3.1, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Gemma 2, Gemma 3 (text),
Phi-3/3.5/4, Mixtral, Qwen2-MoE and Qwen3-MoE differ only in options carried by
`ModelConfig` (biases, q/k norms, `(1 + w)` norms and the extra Gemma norms,
the activation, windows and soft-caps, rope per layer, sparse blocks), so one
module tree serves them all. Parameter names follow the Hugging Face
checkpoints except for the fused projections, which `packed_modules` maps back
to the checkpoint names, and Mixtral's block, which `module_renames` does.

A forward takes the whole step as a `ForwardBatch` (flat tokens of every
request, prefill and decode mixed) and an `AttentionBackend` already planned
for it; it returns float32 logits only for the rows that need them.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.model.config import ModelConfig
from radixserve.model.layers import FusedLinear, Linear, MatmulUser, RMSNorm, RotaryEmbedding, VocabEmbedding
from radixserve.model.moe import SparseMoE
from radixserve.model.options import RopeConfig
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.fp8_format import NORM_FUSE_MAX_WIDTH
from radixserve.runtime.fp8_linear import QuantizedRows
from radixserve.runtime.kernels import TORCH_KERNELS, TorchKernels

# Checkpoint module name -> (our fused module, its part), for checkpoints that store them apart.
PACKED_MODULES = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}


def _norm(config: ModelConfig, dim: int, dtype: torch.dtype) -> RMSNorm:
    return RMSNorm(dim, config.rms_norm_eps, dtype, plus_one=config.norm_plus_one)


class DecoderAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.qkv_proj = FusedLinear(
            config.hidden_size,
            {"q": config.q_size, "k": config.kv_size, "v": config.kv_size},
            bias=config.qkv_bias,
            dtype=dtype,
        )
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=config.o_bias, dtype=dtype)
        self.q_norm = _norm(config, config.head_dim, dtype) if config.qk_norm else None
        self.k_norm = _norm(config, config.head_dim, dtype) if config.qk_norm else None

    def forward(
        self,
        h: torch.Tensor | QuantizedRows,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(h))
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        # Views of the projection's output: backends take strided rows (v is only copied
        # into the pool; the fused rope rotates q and k in place).
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = attn.forward(q, k, v, self.layer_id, batch, rotary.rope)  # rotary where K/V are stored
        return self.o_proj(out.flatten(-2))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up in one matmul."""

    kernels: TorchKernels = TORCH_KERNELS

    def __init__(self, hidden: int, size: int, bias: bool, activation: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.activation = activation
        self.gate_up_proj = FusedLinear(hidden, {"gate": size, "up": size}, bias=bias, dtype=dtype)
        self.down_proj = Linear(size, hidden, bias=bias, dtype=dtype)

    @property
    def fuses_silu_quantizer(self) -> bool:
        """Whether CUDA steps compute SiLU·mul inside the FP8 down projection's input quantizer."""
        return self.activation == "silu" and self.down_proj.row_scaled_fp8

    def forward(self, h: torch.Tensor | QuantizedRows) -> torch.Tensor:
        gate_up = self.gate_up_proj(h)
        if self.activation == "gelu_tanh":
            return self.down_proj(self.kernels.gelu_tanh_and_mul(gate_up))
        if self.fuses_silu_quantizer and gate_up.is_cuda:
            return self.down_proj.silu_mul_forward(gate_up)
        return self.down_proj(self.kernels.silu_and_mul(gate_up))


def _rotary(config: ModelConfig, rope: RopeConfig) -> RotaryEmbedding:
    return RotaryEmbedding(
        rope,
        config.head_dim,
        config.hidden_size,
        config.num_heads,
        config.max_position_embeddings,
        config.rotary_dim,
    )


def _feed_forward(config: ModelConfig, layer_id: int, dtype: torch.dtype) -> nn.Module:
    moe = config.moe
    if moe is None or not moe.sparse_layers[layer_id]:
        return GatedMLP(
            config.hidden_size, config.intermediate_size, config.mlp_bias, config.activation, dtype
        )
    shared = None
    if moe.shared_expert_size:
        shared = GatedMLP(config.hidden_size, moe.shared_expert_size, False, config.activation, dtype)
    return SparseMoE(config, dtype, shared)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(config, layer_id, dtype)
        self.mlp = _feed_forward(config, layer_id, dtype)
        self.input_layernorm = _norm(config, config.hidden_size, dtype)
        self.post_attention_layernorm = _norm(config, config.hidden_size, dtype)
        sandwich = config.sandwich_norms
        self.pre_feedforward_layernorm = _norm(config, config.hidden_size, dtype) if sandwich else None
        self.post_feedforward_layernorm = _norm(config, config.hidden_size, dtype) if sandwich else None

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rotary: RotaryEmbedding,
        attn: AttentionBackend,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it): the stream's next
        add is fused into the next norm. `residual` is None for the first layer, whose
        `x` is the embedding."""
        mlp_input = self.mlp.gate_up_proj if isinstance(self.mlp, GatedMLP) else None
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = _add_norm(self.input_layernorm, x, residual, self.self_attn.qkv_proj)
        x = self.self_attn(h, rotary, attn, batch)
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            # Llama: post_attention_layernorm is the MLP's input norm.
            h, residual = _add_norm(self.post_attention_layernorm, x, residual, mlp_input)
            return self.mlp(h), residual
        # Gemma: attention and MLP outputs are normed before they join the stream.
        x = self.post_attention_layernorm(x)
        h, residual = _add_norm(self.pre_feedforward_layernorm, x, residual, mlp_input)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


def _add_norm(
    norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor, into: Linear | None
) -> tuple[torch.Tensor | QuantizedRows, torch.Tensor]:
    """`norm.add_forward`, quantized in the same kernel where its output feeds (`into`) an FP8
    linear on CUDA: one launch instead of the norm's and the linear's quantizer's."""
    if norm_fuses_quantizer(into) and x.is_cuda:
        return norm.add_quantize_forward(x, residual)
    return norm.add_forward(x, residual)


def norm_fuses_quantizer(into: Linear | None) -> bool:
    """Whether a norm feeding `into` quantizes for it on CUDA: an FP8 linear scaled per row, no wider
    than the fused kernel's rows."""
    return into is not None and into.row_scaled_fp8 and into.in_features <= NORM_FUSE_MAX_WIDTH


class DecoderModel(nn.Module):
    embed_scale: torch.Tensor | None

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, i, dtype) for i in range(config.num_layers))
        self.norm = _norm(config, config.hidden_size, dtype)
        self.rotary_emb = _rotary(config, config.rope)
        local = None if config.local_rope is None else _rotary(config, config.local_rope)
        self.local_rotary_emb = local
        # Each layer's rotary (a plain list: the modules are registered above).
        self._layer_rotary = [
            local if local is not None and config.layer_rope(i) is config.local_rope else self.rotary_emb
            for i in range(config.num_layers)
        ]
        scale = None
        if config.embed_scale is not None:  # a tensor rounded to the model dtype, as transformers does
            device = torch.empty(0).device
            scale = torch.tensor(config.embed_scale, dtype=torch.float32, device="cpu").to(dtype).to(device)
        self.register_buffer("embed_scale", scale, persistent=False)

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Hidden states of every new token, before the final norm: `[T, hidden]`."""
        x = self.embed_tokens(batch.input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        residual: torch.Tensor | None = None
        for layer, rotary in zip(self.layers, self._layer_rotary):
            x, residual = layer(x, residual, rotary, attn, batch)
        return x if residual is None else residual + x


class DecoderForCausalLM(MatmulUser):
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        # How checkpoint names differ from ours (see weights.py): the fused projections'
        # parts, unless the checkpoint stores them fused (Phi-3); the sparse block's name.
        self.packed_modules = {} if config.fused_checkpoint else dict(PACKED_MODULES)
        moe = config.moe
        self.module_renames = {"mlp": moe.block_name} if moe is not None and moe.block_name != "mlp" else {}
        self.model = DecoderModel(config, dtype)
        # Tied: the output projection reads the embedding matrix; no second copy.
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, False, dtype)
        )

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Float32 logits `[rows, vocab]` for `batch.logit_rows`, or for the last
        new token of each request when it is None. The caller has run
        `attn.plan(batch)`."""
        h = self.model(batch, attn)
        rows = batch.logit_rows if batch.logit_rows is not None else batch.last_token_rows()
        # The norm is per row, so normalising only the wanted rows changes nothing but the cost.
        h = self.model.norm(h.index_select(0, rows))
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = self.matmul.linear(h, weight).float()
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
