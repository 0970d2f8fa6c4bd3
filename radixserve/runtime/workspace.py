"""The sampler's share of GPU memory, measured before the KV pool takes its fraction of the rest.

A sampled step over the full batch holds `[rows, vocab]` float32 logits, the penalty state
(int32 counts and a bool mask per row and token) and a penalized copy of the logits, and
works through the rows in chunks of at most `sampler.CHUNK_ENTRIES` logits whose temporaries (the
stable sort of top-k/top-p, cumulative sums, the exponential race's int64 noise) take tens of
bytes per entry (GiBs, were 256 rows of a 262k vocabulary sampled in one go). The engine measures
that peak here, running the very step the sampled graphs capture, and leaves it out of the
memory the KV pool is sized from; `mem_fraction` then applies to what remains, and its rest is
for the model's activations and graphs. Sized as a fixed fraction alone, a large-vocabulary
model on an 80 GiB card ran out of memory capturing its sampled graphs.
"""

from __future__ import annotations

import torch

from radixserve.runtime.sampler import Sampler


def sampling_workspace_bytes(rows: int, vocab_size: int, device: torch.device) -> int:
    """Peak bytes allocated by a sampled step of `rows` rows over `vocab_size` logits on a CUDA
    `device`, with penalties and top-k/top-p: the logits, the penalty state and the step's
    temporaries. 0 on other devices (their KV budget is fixed: engine_build.kv_slots)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        sampler = Sampler(vocab_size, rows, device)
        sampler.ensure_penalty_state()
        logits = torch.zeros(rows, vocab_size, dtype=torch.float32, device=device)
        ids = torch.arange(rows, dtype=torch.int64, device=device)
        sampler.sample_device(logits, ids, ids, top_k_p=True, penalties=True)
        del sampler, logits, ids
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()  # what was measured goes back to the free memory the pool sees
    return peak
