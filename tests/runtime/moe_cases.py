"""Fused MoE cases (radixserve/runtime/fused_moe.py) against the model's reference loop.

`run_moe_cases(device)` builds a `MoEExperts` block with random weights per case and
returns, per case, the largest difference between `fused_moe` and `MoEExperts.forward`
(transformers' loop over the experts) relative to the output's scale, plus checks of the
alignment (every pair once, each block one expert's). On the CPU it runs under the Triton
interpreter (interpreted_cases.py) in float32; on the GPU (`-m gpu`) compiled, in bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.model.moe import MoEExperts, SparseMoE
from radixserve.model.options import MoEConfig
from radixserve.runtime.fused_moe import fused_moe
from radixserve.runtime.kernels import TORCH_KERNELS
from radixserve.runtime.moe_align import align
from radixserve.runtime.moe_route import route_topk


@dataclass(frozen=True)
class MoECase:
    name: str
    tokens: int
    experts: int
    top_k: int
    hidden: int
    inter: int
    activation: str = "silu"
    skewed: bool = False  # every token picks among the first k + 1 experts (empty experts, long runs)


CASES = [
    MoECase("one_token", 1, 8, 2, 64, 32),
    MoECase("decode_batch", 13, 16, 4, 64, 96, activation="gelu_tanh"),
    MoECase("prefill", 70, 8, 2, 96, 64),
    MoECase("skewed_runs", 40, 32, 3, 64, 48, skewed=True),
    MoECase("odd_sizes", 9, 6, 2, 80, 40),
    MoECase("long_runs", 200, 4, 2, 64, 32),  # 100 pairs per expert: 64-row blocks
    MoECase("many_pairs", 300, 16, 4, 32, 16),  # 1,200 pairs, 90 blocks: the align loops go round
    MoECase("prefill_blocks", 520, 8, 2, 64, 48),  # 130 pairs per expert: 128-row blocks, PREFILL_TILES
    # Over moe_align.PARALLEL_PAIRS (4,096): the alignment's passes in one program per chunk.
    MoECase("wide_prefill", 1100, 16, 4, 32, 16),
    MoECase("wide_skewed", 1100, 16, 4, 32, 16, skewed=True),  # 11 experts empty, 5 long runs
]


def _routing(case: MoECase, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    pool = case.top_k + 1 if case.skewed else case.experts
    scores = torch.rand(case.tokens, pool, generator=gen)
    top_w, top_idx = scores.topk(case.top_k, dim=-1)
    return top_idx, top_w / top_w.sum(-1, keepdim=True)


def _alignment_ok(top_idx: torch.Tensor, experts: int, block_m: int) -> bool:
    al = align(top_idx, experts, block_m)
    pairs = al.sorted_pairs.cpu()
    total = int(al.padded_total)
    real = pairs[:total][pairs[:total] < al.num_pairs]
    if sorted(real.tolist()) != list(range(al.num_pairs)) or bool((pairs[total:] != al.num_pairs).any()):
        return False
    flat = top_idx.reshape(-1).cpu()
    blocks = al.block_expert.cpu()
    return all(
        int(flat[p]) == int(blocks[i // block_m])
        for i, p in enumerate(pairs[:total].tolist())
        if p < len(flat)
    )


def run_moe_cases(seed: int = 0, device: str = "cpu") -> dict[str, dict[str, float | bool]]:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    out: dict[str, dict[str, float | bool]] = {}
    for case in CASES:
        gen = torch.Generator().manual_seed(seed)
        moe = MoEConfig(
            num_experts=case.experts,
            top_k=case.top_k,
            intermediate_size=case.inter,
            sparse_layers=(True,),
            renormalize=True,
        )
        block = MoEExperts(moe, case.hidden, case.activation, dtype).to(device)
        with torch.no_grad():
            block.gate_up_proj.copy_(torch.randn(block.gate_up_proj.shape, generator=gen) * 0.1)
            block.down_proj.copy_(torch.randn(block.down_proj.shape, generator=gen) * 0.1)
        x = torch.randn(case.tokens, case.hidden, generator=gen).to(device, dtype)
        top_idx, top_w = _routing(case, gen)
        top_idx, top_w = top_idx.to(device), top_w.to(device, dtype)
        with torch.no_grad():
            want = block.reference(x, top_idx, top_w).float()
            act = (
                TORCH_KERNELS.gelu_tanh_and_mul
                if case.activation == "gelu_tanh"
                else TORCH_KERNELS.silu_and_mul
            )
            got = fused_moe(x, top_idx, top_w, block.gate_up_proj, block.down_proj, act).float()
        scale = float(want.abs().max()) or 1.0
        out[case.name] = {
            "rel_err": float((got - want).abs().max()) / scale,
            "aligned": all(_alignment_ok(top_idx, case.experts, m) for m in (16, 32)),
        }
    return out


ROUTE_CASES = [  # (name, tokens, experts, top_k, renormalize): Qwen3-MoE, Mixtral, Qwen2-MoE shapes
    ("qwen3_moe", 37, 128, 8, True),
    ("mixtral", 5, 8, 2, True),
    ("not_renormalized", 20, 60, 4, False),
    ("one_token", 1, 16, 4, True),
]


def run_route_cases(seed: int = 0, device: str = "cpu") -> dict[str, dict[str, float | bool]]:
    """`route_topk` against `SparseMoE.route` (transformers' router: softmax, topk, renormalise).

    Per case: whether the ids agree (as sets per token: torch.topk's order among equal values
    is its own) and the largest weight difference, ids matched."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    out: dict[str, dict[str, float | bool]] = {}
    for name, tokens, experts, top_k, renorm in ROUTE_CASES:
        gen = torch.Generator().manual_seed(seed)
        logits = (torch.randn(tokens, experts, generator=gen) * 3).to(device, dtype)
        want_i, want_w = SparseMoE.route_logits(logits, top_k, renorm)
        got_i, got_w = route_topk(logits, top_k, renorm)
        want = {(t, int(i)): float(w) for t in range(tokens) for i, w in zip(want_i[t], want_w[t])}
        got = {(t, int(i)): float(w) for t in range(tokens) for i, w in zip(got_i[t], got_w[t])}
        same = want.keys() == got.keys()
        err = max(abs(want[key] - got[key]) for key in want) if same else float("inf")
        out[name] = {"same_experts": same, "max_err": err}
    return out
