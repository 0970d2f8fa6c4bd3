"""W1's bandwidth bound for any model shape: the bytes a decode step must read, summed over W1.

Each decode step reads every weight a token of the batch touches (all dense weights; of a
sparse block, the experts some token picked: `E * (1 - (1 - k/E)^B)` expected for B tokens
with uniform routing) and the K/V of every running request's context, at the HBM bandwidth.
W1's requests all start at once, so step s runs the requests whose output is longer than s,
each with `input + s + 1` tokens of context. Prefill and everything else is left out, so the
bound is an upper limit. `hbm_tb_s` is the GPU's peak (4.8 TB/s on an H200, 3.35 on an H100). With
`quantization="fp8"` the linears the engine quantizes count one byte per weight (and four
per output row of scale); experts, embeddings, norms and lm_head keep `dtype_bytes`.
"""

from __future__ import annotations

import torch

from benchmarks.common import Request
from radixserve.model.config import ModelConfig
from radixserve.model.fp8 import quantize_model_
from radixserve.model.registry import resolve_architecture

# Peak HBM bandwidth by GPU name (vendor data sheets): the bound is for the card that ran.
HBM_TB_S = {"H200": 4.8, "H100 80GB HBM3": 3.35}
DEFAULT_TB_S = 4.8


def peak_tb_s(device_name: str) -> float:
    """The peak bandwidth of the GPU named `device_name` (torch.cuda.get_device_name);
    an H200's for a card not listed."""
    return next((tb for key, tb in HBM_TB_S.items() if key in device_name), DEFAULT_TB_S)


def w1_bound(
    hf_config: object,
    reqs: list[Request],
    dtype_bytes: int = 2,
    hbm_tb_s: float = 4.8,
    quantization: str | None = None,
) -> float:
    """Output tokens per second if every step took its bytes / bandwidth."""
    _, cls = resolve_architecture(
        getattr(hf_config, "architectures", None), getattr(hf_config, "model_type", None)
    )
    config = ModelConfig.from_hf(hf_config)
    with torch.device("meta"):
        model = cls(config, dtype=torch.bfloat16)
        if quantization is not None:
            quantize_model_(model)  # on meta tensors: the FP8 layout, no arithmetic
    sizes = {torch.bfloat16: dtype_bytes, torch.float8_e4m3fn: 1, torch.float32: 4}
    params_bytes = sum(p.numel() * sizes[p.dtype] for p in model.parameters())
    experts, expert_bytes, top_k = 0, 0, 0
    if config.moe is not None:
        experts, top_k = config.moe.num_experts, config.moe.top_k
        sparse = sum(config.moe.sparse_layers)
        expert_bytes = 3 * config.hidden_size * config.moe.intermediate_size * sparse * dtype_bytes
    dense_bytes = params_bytes - experts * expert_bytes
    kv_per_token = config.num_layers * config.num_kv_heads * config.head_dim * 2 * dtype_bytes
    lengths = [(len(ids), out) for ids, out in reqs]
    seconds, tokens = 0.0, 0
    for s in range(max(out for _, out in lengths)):
        running = [i for i, out in lengths if out > s]
        touched = experts * (1 - (1 - top_k / experts) ** len(running)) if experts else 0.0
        kv = sum(i + s + 1 for i in running) * kv_per_token
        seconds += (dense_bytes + touched * expert_bytes + kv) / (hbm_tb_s * 1e12)
        tokens += len(running)
    return tokens / seconds
