"""The Llama family over a paged KV pool: Llama 2/3/3.1, SmolLM2, Mistral, Qwen2/2.5, Qwen3.

The variants differ only in options carried by `ModelConfig` (biases, q/k
norm, tied embeddings, rope scaling), so one module tree serves them all.
Parameter names follow the Hugging Face checkpoints except for the fused
projections, which `packed_modules` maps back to the checkpoint names.

A forward takes the whole step as a `ForwardBatch` (flat tokens of every
request, prefill and decode mixed) and an `AttentionBackend` already planned
for it; it returns float32 logits only for the rows that need them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.model.config import ModelConfig
from radixserve.model.layers import (
    FusedLinear,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
)
from radixserve.runtime.attention.base import AttentionBackend
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.kernels import TORCH_KERNELS, TorchKernels


class LlamaAttention(nn.Module):
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
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None

    def forward(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
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
        q, k = rotary(positions, q, k)
        out = attn.forward(q, k, v, self.layer_id, batch)
        return self.o_proj(out.flatten(-2))


class LlamaMLP(nn.Module):
    kernels: TorchKernels = TORCH_KERNELS

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = FusedLinear(
            config.hidden_size, {"gate": size, "up": size}, bias=config.mlp_bias, dtype=dtype
        )
        self.down_proj = Linear(size, config.hidden_size, bias=config.mlp_bias, dtype=dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.kernels.silu_and_mul(self.gate_up_proj(h)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, dtype)
        self.mlp = LlamaMLP(config, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

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
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(x, batch.positions, rotary, attn, batch)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i, dtype) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(
            config.rope,
            config.head_dim,
            config.hidden_size,
            config.num_heads,
            config.max_position_embeddings,
        )

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Hidden states of every new token, before the final norm: `[T, hidden]`."""
        x = self.embed_tokens(batch.input_ids)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer(x, residual, self.rotary_emb, attn, batch)
        return x if residual is None else residual + x


class LlamaForCausalLM(nn.Module):
    # Checkpoint module name -> (our fused module, its part).
    packed_modules: ClassVar[dict[str, tuple[str, str]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, dtype)
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
        return F.linear(h, weight).float()
