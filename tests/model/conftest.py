"""Shared fixtures for the model-layer tests: our greedy loop over a KV pool, and the HF reference.

`greedy` runs OUR model through the paged path the engine will use: slots
from a pool (handed out in a scrambled order, so nothing can rely on a
request's slots being contiguous), `ForwardBatch.build`, `TorchAttention`,
argmax. Three schedules:

- "single": one request at a time (prefill, then decode);
- "mixed": request i joins at step i, so most steps hold the prefill of one
  request and the decode of the others in the same forward;
- "split": every prompt's first half is prefilled in one call, the rest is
  extended over that cached prefix in a later call, then all decode together.

EOS is ignored on both sides (the HF reference model's generation_config has
no eos), so every comparison covers the full number of new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from radixserve.cache.kv_pool import KVPool
from radixserve.model.config import ModelConfig
from radixserve.model.loader import LoadedModel, load_model
from radixserve.runtime.attention import TorchAttention
from radixserve.runtime.forward_batch import ForwardBatch

MODES = ("single", "mixed", "split")


@dataclass
class _Seq:
    tokens: list[int]
    max_new: int
    slots: list[int] = field(default_factory=list)  # slots of the tokens already in the pool
    out: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new


class GreedyLoop:
    """A minimal runner: a KV pool, a slot counter over a scrambled slot order, greedy steps."""

    def __init__(self, model: nn.Module, config: ModelConfig, num_slots: int, seed: int = 0) -> None:
        self.model = model
        self.pool = KVPool(config.kv_pool_config(torch.float32, "cpu"), num_slots)
        self.attn = TorchAttention(
            self.pool,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.attn_scale,
            options=config.attention_options(),
        )
        self._order = torch.randperm(num_slots, generator=torch.Generator().manual_seed(seed))
        self._next = 0

    def alloc(self, n: int) -> list[int]:
        slots = self._order[self._next : self._next + n].tolist()
        assert len(slots) == n, "test pool too small"
        self._next += n
        return slots

    @torch.inference_mode()
    def step(self, seqs: Sequence[_Seq], chunks: Sequence[int]) -> None:
        """Seq i brings its next `chunks[i]` uncached tokens; a seq whose tokens are then
        all cached gets its argmax appended."""
        ids: list[int] = []
        prefix_lens, context = [], []
        for seq, n in zip(seqs, chunks, strict=True):
            start = len(seq.slots)
            assert 0 < n <= len(seq.tokens) - start
            ids += seq.tokens[start : start + n]
            prefix_lens.append(start)
            seq.slots += self.alloc(n)
            context.append(torch.tensor(seq.slots))
        batch = ForwardBatch.build(ids, list(chunks), prefix_lens, context)
        self.attn.plan(batch)
        next_ids = self.model(batch, self.attn).argmax(dim=-1).tolist()
        for seq, tok in zip(seqs, next_ids, strict=True):
            if len(seq.slots) == len(seq.tokens):
                seq.tokens.append(tok)
                seq.out.append(tok)

    def decode_all(self, seqs: Sequence[_Seq]) -> None:
        while active := [s for s in seqs if not s.done]:
            self.step(active, [1] * len(active))


def greedy_generate(
    model: nn.Module, config: ModelConfig, prompts: Sequence[Sequence[int]], max_new: int, mode: str
) -> list[list[int]]:
    """Greedy `max_new` tokens for each prompt through our model layer, scheduled by `mode`."""
    seqs = [_Seq(list(p), max_new) for p in prompts]
    loop = GreedyLoop(model, config, sum(len(p) + max_new for p in prompts) + 8)
    if mode == "single":
        for seq in seqs:
            loop.step([seq], [len(seq.tokens)])
            loop.decode_all([seq])
    elif mode == "mixed":
        t = 0
        while not all(s.done for s in seqs):
            # Seq i enters at step i with its whole prompt; the others decode one token.
            active = [s for i, s in enumerate(seqs) if i <= t and not s.done]
            loop.step(active, [len(s.tokens) - len(s.slots) for s in active])
            t += 1
    elif mode == "split":
        loop.step(seqs, [len(s.tokens) // 2 for s in seqs])
        loop.step(seqs, [len(s.tokens) - len(s.slots) for s in seqs])
        loop.decode_all(seqs)
    else:
        raise ValueError(mode)
    return [s.out for s in seqs]


@torch.inference_mode()
def our_logits(
    model: nn.Module, config: ModelConfig, ids: Sequence[int], rows: torch.Tensor | None
) -> torch.Tensor:
    """Logits of one prompt's single prefill, for `rows` (None: the last token)."""
    loop = GreedyLoop(model, config, len(ids) + 4)
    batch = ForwardBatch.build(
        list(ids), [len(ids)], [0], [torch.tensor(loop.alloc(len(ids)))], logit_rows=rows
    )
    loop.attn.plan(batch)
    return model(batch, loop.attn)


@torch.inference_mode()
def hf_greedy(hf_model: Any, ids: Sequence[int], max_new: int) -> list[int]:
    """transformers' greedy `generate`, one unpadded prompt, EOS ignored (see `no_eos`)."""
    x = torch.tensor([list(ids)])
    out = hf_model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new)
    new = out[0, len(ids) :].tolist()
    assert len(new) == max_new, "reference stopped early: EOS was not disabled"
    return new


def no_eos(hf_model: Any) -> Any:
    """Let `generate` run to max_new_tokens. A GenerationConfig passed to generate()
    is merged with the model's own, whose eos would win, so edit the model's."""
    hf_model.generation_config.eos_token_id = None
    hf_model.generation_config.pad_token_id = 0
    return hf_model


# Tiny configurations of every supported architecture, each exercising its own options.
_TINY_COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
# The families beyond Llama's options. Their windows (8) are shorter than most test prompts;
# soft-caps are small enough that tanh bends the logits; Phi-3's LongRoPE switches to its long
# factors at position 40, past every test sequence (test_longrope_* walks past it).
NEW_KINDS = ("gemma2", "gemma3", "phi3-longrope", "mixtral", "qwen3-moe", "qwen2-moe")
TINY_KINDS = ("llama3-rope", "llama-tied-bias", "mistral", "qwen2-sharded", "qwen3", *NEW_KINDS)
WINDOW = 8


def tiny_hf_config(kind: str) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    c = dict(_TINY_COMMON)
    if kind in NEW_KINDS:
        return _new_family_config(kind, c)
    if kind == "llama3-rope":
        # original_max_position_embeddings=64 with head_dim 16 puts frequencies in all
        # three llama3 bands (kept, smoothed, divided by factor).
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        scaling["original_max_position_embeddings"] = 64
        return LlamaConfig(**c, rope_theta=10000.0, rope_scaling=scaling, tie_word_embeddings=False)
    if kind == "llama-tied-bias":
        c["num_key_value_heads"] = 4
        return LlamaConfig(
            **c, tie_word_embeddings=True, attention_bias=True, mlp_bias=True, rope_theta=500.0
        )
    if kind == "mistral":
        return MistralConfig(**c, head_dim=32, sliding_window=None, tie_word_embeddings=False)
    if kind == "qwen2-sharded":
        return Qwen2Config(**c, tie_word_embeddings=True, rope_theta=1e6)
    if kind == "qwen3":
        return Qwen3Config(**c, head_dim=32, tie_word_embeddings=False)
    raise ValueError(kind)


def _new_family_config(kind: str, c: dict[str, Any]) -> Any:
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        MixtralConfig,
        Phi3Config,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    if kind == "gemma2":  # alternating sliding / full layers, both soft-caps, its own query scale
        c["num_hidden_layers"] = 4
        return Gemma2Config(
            **c,
            head_dim=32,
            sliding_window=WINDOW,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=4.0,
        )
    if kind == "gemma3":  # q/k norms, a local rope base and a scaled global rope
        c["num_hidden_layers"] = 3
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        }
        return Gemma3TextConfig(
            **c,
            head_dim=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters=rope,
            query_pre_attn_scalar=32,
        )
    if kind == "phi3-longrope":  # fused checkpoints, partial rotary, LongRoPE, one window everywhere
        rotary_half = 4  # head_dim 16 * partial 0.5 / 2
        scaling = {
            "type": "longrope",
            "short_factor": [1.0, 1.1, 1.3, 1.6][:rotary_half],
            "long_factor": [1.5, 2.5, 4.0, 7.0][:rotary_half],
        }
        return Phi3Config(
            **c,
            rope_scaling=scaling,
            original_max_position_embeddings=40,
            partial_rotary_factor=0.5,
            sliding_window=12,
            tie_word_embeddings=False,
        )
    if kind == "mixtral":  # renormalised top-2 of 4 experts, a window on every layer
        return MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW)
    if kind == "qwen3-moe":  # top-2 of 8 without renormalising; layer 1 dense between sparse ones
        c["num_hidden_layers"] = 3
        return Qwen3MoeConfig(
            **c,
            head_dim=16,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            mlp_only_layers=[1],
        )
    if kind == "qwen2-moe":  # a gated shared expert; sparse every second layer; renormalised
        c["num_hidden_layers"] = 4
        return Qwen2MoeConfig(
            **c,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=2,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=2,
        )
    raise ValueError(kind)


@torch.no_grad()
def make_tiny_checkpoint(kind: str, folder: Any, seed: int = 0) -> Any:
    """A random HF model of `kind` saved as safetensors into `folder`; returns the HF model.

    Every parameter is redrawn (norm weights around 1, biases non-zero), so each
    weight, q/k norm and bias influences the logits and a mis-mapped one fails.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(kind), dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        else:
            p.normal_(0.0, 0.1)
    shard = {"max_shard_size": "40KB"} if kind.endswith("sharded") else {}
    model.save_pretrained(folder, safe_serialization=True, **shard)
    return no_eos(model)


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    """The embedded default with real weights, float32 on the CPU (converted once per cache)."""
    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer_pair(embedded: LoadedModel) -> tuple[Any, Any]:
    """The embedded model's `TextTokenizer` and transformers' AutoTokenizer of its folder."""
    from transformers import AutoTokenizer

    from radixserve.model.text_tokenizer import TextTokenizer

    assert isinstance(embedded.tokenizer, TextTokenizer) and embedded.path is not None
    return embedded.tokenizer, AutoTokenizer.from_pretrained(embedded.path)


@pytest.fixture(scope="session")
def hf_embedded(embedded: LoadedModel) -> Any:
    from transformers import AutoModelForCausalLM

    assert embedded.path is not None
    model = AutoModelForCausalLM.from_pretrained(embedded.path, dtype=torch.float32)
    return no_eos(model.eval())


@pytest.fixture(scope="session")
def helpers() -> Any:
    """The module's helpers for tests (conftest modules are not imported by name)."""

    class _Helpers:
        greedy_generate = staticmethod(greedy_generate)
        greedy_loop = GreedyLoop
        our_logits = staticmethod(our_logits)
        hf_greedy = staticmethod(hf_greedy)
        no_eos = staticmethod(no_eos)
        make_tiny_checkpoint = staticmethod(make_tiny_checkpoint)
        tiny_kinds = TINY_KINDS
        rel_err = staticmethod(rel_err)
        modes = MODES

    return _Helpers
