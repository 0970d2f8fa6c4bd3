"""What the engine's maintenance calls run on the worker thread, between steps."""

from __future__ import annotations

from radixserve.sched.scheduler import Scheduler
from radixserve.sched.worker import Worker


def flush_cache(s: Scheduler) -> bool:
    """Empty the radix cache; False (nothing done) while requests are running."""
    if s.has_work or s.cache is None:
        return s.cache is None and not s.has_work
    s.cache.reset()
    return True


def read_stats(s: Scheduler, worker: Worker | None) -> dict[str, float]:
    return {
        "waiting": len(s.waiting),
        "running": len(s.running),
        "free_slots": s.allocator.num_free,
        "total_slots": s.allocator.num_slots,
        "cached_tokens": s.cache.total_size if s.cache else 0,
        "prompt_tokens": s.prompt_tokens_admitted,
        "prompt_tokens_cached": s.cached_tokens_admitted,
        "retractions": s.retractions,
        "forward_steps": worker.steps if worker else 0,
        # Outputs the worker built and posted: a streamed request gets none while its
        # previous one is unread by its consumer (backpressure, sched/process.py).
        "outputs": worker.outputs if worker else 0,
        "jump_forward_tokens": s.jump_forward_tokens,
        # Forced tokens appended without a forward pass each, less the in-flight
        # tokens those jumps discarded (overlap mode).
        "forward_passes_saved": s.jump_forward_tokens - s.jump_discarded,
        "mask_fill_s": worker.mask_fill_s if worker else 0.0,
        "mask_rows": worker.mask_rows if worker else 0,
        # Shared-prefix (cascade) decode: steps that read shared prefixes once per
        # group, and the K/V slot reads (per layer) they avoided.
        "cascade_steps": s.grouper.steps if s.grouper is not None else 0,
        "cascade_saved_slot_reads": s.grouper.saved_tokens if s.grouper is not None else 0,
    }
