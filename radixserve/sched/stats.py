"""`SchedulerStats`: the scheduler's counters, read between steps (`AsyncEngine.stats()`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SchedulerStats:
    waiting: int  # requests queued, retracted ones included
    running: int  # admitted: prefilling in chunks or decoding
    free_slots: int  # KV slots in no request and no tree node
    total_slots: int
    cached_tokens: int  # tokens the radix tree holds
    prompt_tokens: int  # prompt tokens admitted (first admission of each request)
    prompt_tokens_cached: int  # ...of which served from the radix cache
    retractions: int  # requests sent back to the queue because the pool ran dry
    jump_forward_tokens: int  # output tokens appended by jump-forward
    # Forced tokens appended without a forward pass each, less the in-flight tokens those
    # jumps discarded (overlap mode).
    forward_passes_saved: int
    # Shared-prefix (cascade) decode: steps that read shared prefixes once per group, and the
    # K/V slot reads (per layer) they avoided.
    cascade_steps: int
    cascade_saved_slot_reads: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
