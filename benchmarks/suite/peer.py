"""The transformers peer of the same model, given its best: warmed up, batch size swept.

`hf_peer` builds transformers' model of the same config (its own random
weights: speed does not depend on their values); `hf_twin` gives it exactly
the engine's dummy weights (`checkpoint_views`) for comparing tokens. `sweep`
runs padded `generate` (left padding, longest outputs first, each batch run
to its longest output with only the tokens each request asked for counted)
at each batch size, largest first, and stops at the first size slower than
the one before it (padded decode gets cheaper per token as the batch grows,
until it does not) or when the time budget is spent; what was skipped, and
why, is recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.suite.engines import Target, free_memory, hf_config, load_format
from radixserve.model.loader import load_model
from radixserve.model.weights import checkpoint_views

Req = tuple[list[int], int]


def hf_peer(target: Target, spec: str) -> Any:
    """transformers' model of `spec`'s config with its own random weights (same dtype and device).

    Speed does not depend on the weights' values when generation ignores EOS, and this holds one
    copy of the weights where `hf_twin` briefly holds two (mixtral-8x7b's 93 GB would not fit).
    """
    from transformers import AutoModelForCausalLM

    with torch.device(target.device):  # real init (buffers like rotary inv_freq)
        hf = AutoModelForCausalLM.from_config(hf_config(spec), dtype=getattr(torch, target.dtype))
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()


def hf_twin(target: Target, spec: str) -> Any:
    """`hf_peer` holding exactly the engine's weights of `spec`: for comparing tokens."""
    loaded = load_model(spec, getattr(torch, target.dtype), target.device, load_format=load_format(spec))
    hf = hf_peer(target, spec)
    # Checkpoint names (q/k/v of a fused qkv, per-expert tensors) where transformers' modules
    # use them; our own names where they match its modules instead (stacked experts).
    wanted = set(hf.state_dict())
    views = {**dict(loaded.model.named_parameters()), **checkpoint_views(loaded.model)}
    missing, unexpected = hf.load_state_dict({k: v for k, v in views.items() if k in wanted}, strict=False)
    assert not unexpected, unexpected
    assert all("lm_head" in m for m in missing), missing  # tied: lm_head reads the embedding
    del loaded
    free_memory()
    return hf


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def hf_generate(hf: Any, reqs: list[Req], batch: int, device: str) -> tuple[float, int]:
    """(output tok/s, tokens computed) of padded `generate` in batches of `batch`."""
    order = sorted(reqs, key=lambda r: -r[1])  # longest outputs first: least padding waste
    _sync(device)
    t0 = time.perf_counter()
    useful = computed = 0
    for i in range(0, len(order), batch):
        chunk = order[i : i + batch]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (p, _) in enumerate(chunk):  # left padding
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        n_out = max(n for _, n in chunk)
        with torch.inference_mode():
            hf.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                do_sample=False,
                max_new_tokens=n_out,
                min_new_tokens=n_out,
            )
        useful += sum(n for _, n in chunk)
        computed += n_out * len(chunk)
    _sync(device)
    return useful / (time.perf_counter() - t0), computed


@dataclass
class SweepResult:
    tok_s: dict[int, float] = field(default_factory=dict)  # batch size -> output tok/s
    computed: dict[int, int] = field(default_factory=dict)  # tokens computed (padding included)
    skipped: dict[int, str] = field(default_factory=dict)  # batch size -> why it did not run
    seconds: float = 0.0

    @property
    def best(self) -> int:
        return max(self.tok_s, key=lambda b: self.tok_s[b])


def sweep(hf: Any, reqs: list[Req], batch_sizes: list[int], device: str, budget_s: float) -> SweepResult:
    res = SweepResult()
    t_start = time.perf_counter()
    hf_generate(hf, [(ids[:32], 4) for ids, _ in reqs[:2]], 2, device)  # warm-up: kernels, allocator
    for b in sorted(set(batch_sizes), reverse=True):
        spent = time.perf_counter() - t_start
        if res.tok_s and spent > budget_s:
            res.skipped[b] = f"time budget {budget_s:.0f} s spent ({spent:.0f} s)"
            continue
        prev = min(res.tok_s) if res.tok_s else None
        if prev is not None and res.tok_s[prev] < max(res.tok_s.values()):
            res.skipped[b] = f"batch {prev} was already slower than batch {res.best}"
            continue
        try:
            res.tok_s[b], res.computed[b] = hf_generate(hf, reqs, b, device)
        except torch.OutOfMemoryError as err:  # a batch the GPU can't hold: try the smaller ones
            res.skipped[b] = f"out of memory: {str(err).splitlines()[0][:160]}"
            torch.cuda.empty_cache()
    res.seconds = time.perf_counter() - t_start
    return res
