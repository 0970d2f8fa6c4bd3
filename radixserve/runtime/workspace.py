"""The sampler's share of GPU memory, measured before the KV pool takes its fraction of the rest.

A step over the full batch holds `[rows, vocab]` float32 logits, and sampling them with every
path on (penalties, top-k/top-p's stable sort, min-p, the exponential race's int64 noise)
needs several more tensors of that shape at once: about 60 bytes per logit, so 4 GiB at 256
rows of a 262k vocabulary (Gemma 3), and the penalty counts stay allocated for good. The
engine measures that peak here, on the device and with the kernels the sampled graphs
capture, and leaves it out of the memory the KV pool is sized from; `mem_fraction` then
applies to what remains, and its rest is for the model's own activations. Sized as a
fixed fraction alone, a large-vocabulary model on an 80 GiB card ran out of memory
capturing its sampled graphs.
"""

from __future__ import annotations

import torch

from radixserve.runtime.noise import column_keys
from radixserve.runtime.sample_ops import PRES, REP, TEMP, TOP_K, TOP_P, apply_penalties, draw


def sampling_workspace_bytes(rows: int, vocab_size: int, device: torch.device) -> int:
    """Peak bytes allocated by a sampled step of `rows` rows over `vocab_size` logits on a CUDA
    `device`: the logits, the penalty state, and the temporaries of penalties, top-k/top-p,
    min-p and the draw. 0 on other devices (their KV budget is fixed, engine_build.kv_slots)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        logits = torch.zeros(rows, vocab_size, dtype=torch.float32, device=device)
        counts = torch.zeros(rows + 1, vocab_size, dtype=torch.int32, device=device)
        seen = torch.zeros(rows + 1, vocab_size, dtype=torch.bool, device=device)
        par = torch.zeros(rows, PRES + 1, dtype=torch.float32, device=device)  # min-p 0, not greedy
        par[:, TEMP], par[:, TOP_K], par[:, TOP_P], par[:, REP] = 1.0, vocab_size, 0.9, 1.0
        keys = torch.arange(rows, dtype=torch.int64, device=device)
        x = logits.clone()
        apply_penalties(x, counts[:rows], seen[:rows], par)
        draw(x, par, keys, keys, column_keys(vocab_size, device), top_k_p=True, min_p=True)
        del logits, counts, seen, x
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()  # what was measured goes back to the free memory the pool sees
    return peak
