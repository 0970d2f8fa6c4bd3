"""Greedy agreement with transformers on the same weights, teacher-forced.

transformers reads each prompt plus our tokens once; we count positions where
its argmax equals our token, against its bf16 and its float32 logits, and how
often transformers' own bf16 and float32 argmax agree (the floor bf16
rounding sets with random weights).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from benchmarks.suite.context import Ctx
from benchmarks.suite.engines import greedy, hf_config, one, running_engine
from benchmarks.suite.peer import hf_twin


def correctness(ctx: Ctx, spec: str, backends: list[str]) -> None:
    t, rec = ctx.target, ctx.rec
    n_prompts, hi, n_tokens = ctx.sizes.correctness
    rng = random.Random(1)
    vocab = t.vocab(spec)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(16, hi))] for _ in range(n_prompts)]
    ours: dict[str, list[list[int]]] = {}
    for backend in backends:
        cfg = t.config(spec, attention_backend=backend, cuda_graph=backend == "flashinfer")
        with running_engine(cfg) as (engine, loop):
            outs = loop.run_until_complete(engine.generate_many(prompts, greedy(n_tokens)))
        ours[backend] = [list(one(o).token_ids) for o in outs]
    hf = hf_twin(t, spec)

    def predict(seqs: list[list[int]]) -> list[list[int]]:
        with torch.no_grad():
            return [
                hf(torch.tensor([p + s], device=t.device)).logits[0, len(p) - 1 : -1].argmax(-1).tolist()
                for p, s in zip(prompts, seqs)
            ]

    def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
        same = sum(x == y for sa, sb in zip(a, b) for x, y in zip(sa, sb))
        return same / sum(len(s) for s in a), sum(sa == sb for sa, sb in zip(a, b)) / len(a)

    name = t.name(spec)
    low = {b: predict(seqs) for b, seqs in ours.items()}
    hf.float()  # the float32 reference on the same weights: how noisy bf16 itself is here
    fp32 = {b: predict(seqs) for b, seqs in ours.items()}
    for backend, seqs in ours.items():
        top1, exact = agreement(seqs, low[backend])
        setting = f"backend={backend}"
        rec("correctness", name, setting, "top1_agreement", top1, target=0.99)
        rec("correctness", name, setting, "exact_sequences", exact)
        rec("correctness", name, setting, "top1_agreement_vs_fp32", agreement(seqs, fp32[backend])[0])
        rec(
            "correctness",
            name,
            setting,
            f"transformers_{'bf16' if t.dtype == 'bfloat16' else t.dtype}_vs_fp32",
            agreement(low[backend], fp32[backend])[0],
        )


def tiny_checkpoint(folder: Path) -> str:
    """A saved tiny random Llama (weights included), head_dim 64 like qwen2.5-0.5b's FlashInfer build."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return str(folder)


def truncated(spec: str, layers: int, root: Path) -> str:
    """A config-only folder of `spec`'s shape cut to its first `layers` layers (random weights).

    For models whose float32 transformers twin does not fit the GPU beside nothing else
    (mixtral-8x7b: 188 GB): every kind of layer the shape has still runs, and its name in
    the records says how many layers ("mixtral-8x7b-8-layers")."""
    cfg = hf_config(spec)
    if layers >= cfg.num_hidden_layers:
        return spec
    cfg.num_hidden_layers = layers
    if isinstance(getattr(cfg, "layer_types", None), list):  # per-layer lists follow the cut
        cfg.layer_types = cfg.layer_types[:layers]
    folder = root / f"{spec.removeprefix('dummy:')}-{layers}-layers"
    cfg.save_pretrained(folder)
    return str(folder)
