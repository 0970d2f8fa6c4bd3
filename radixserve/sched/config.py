"""`SchedulerConfig`: the scheduling policy's knobs (sched/scheduler.py says what they do)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int = 256
    prompt_logprob_rows: int = 1024  # prompt positions one step may score (prompt logprobs)
    chunked_prefill_size: int = 8192  # prefill tokens per step
    # ...at most, in a step that also decodes, unless more than a chunk of prompt tokens waits
    mixed_prefill_tokens: int = 512
    enable_radix_cache: bool = True
    decode_reserve_ratio: float = 0.25  # fraction of each request's remaining tokens kept free
    lpm_max_queue: int = 128  # longest-prefix-first up to this queue length, FCFS beyond
    defer_shared_min: int = 32  # shared uncached tokens that make a request wait a step
    # Structured output's jump-forward of forced text after a sampled token (sched/grammar.py)
    # where a request leaves it at None: on where a forward pass costs more than a mixed
    # step's loss of the CUDA-graph path. The forced text before the first token and a
    # forced stop token need no step of their own and are on regardless.
    jump_forward_default: bool = True
    # Overlap mode on a device whose launch() runs the step before returning (the CPU):
    # process the step in flight before building one with a jump-forward request in it.
    # Overlap hides nothing there, and a jump then discards no in-flight token.
    hold_for_jumps: bool = False
    # A streamed request gets an output every this many tokens (its first and last always);
    # the tokens in between are carried by the next one (EngineConfig.stream_interval).
    stream_interval: int = 1
    # ...and at least this many seconds after the previous one (EngineConfig.stream_interval_ms).
    stream_gap_s: float = 0.0
    mixed_steps: bool = True  # decode tokens and prefill chunks share a step (False: prefill first)
    # Shared-prefix (cascade) decode: the least prefix, in tokens, that a group of running
    # requests must share to read it once (sched/cascade.py); 0 turns grouping off.
    cascade_min_shared: int = 0
    cascade_min_saved: int = 0  # ...and the least slot reads a step's groups must save to be used
