"""What every section of the suite shares: the target, the recorder, the sizes, figures so far.

`Sizes.full()` are the workloads of BENCHMARKS.md (scaled where
the time budget of one H200 run asks for it, as each field says);
`Sizes.quick()` shrinks everything for a smoke run (CPU CI or a GPU
shakedown): such figures show that the code runs, not how fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.suite.engines import Target
from benchmarks.suite.report import Recorder


@dataclass(frozen=True)
class Sizes:
    correctness: tuple[int, int, int] = (64, 256, 32)  # prompts, longest prompt, greedy tokens
    w1_n: int = 256
    w1_lo: int = 100
    w1_hi: int = 1024
    peer_n: int = 64  # the peer (and radixserve again) on the first peer_n W1 requests...
    peer_max_out: int = 128  # ...with outputs capped here: the peer's sweep must fit the budget
    peer_batches: tuple[int, ...] = (64, 32, 16)
    peer_budget_s: float = 90.0
    w2: tuple[int, int, int, int] = (1024, 512, 32, 32)  # prefix, requests, question, output
    w2_turns: tuple[int, int, int] = (64, 8, 64)  # conversations, turns, tokens per turn (in and out)
    w3_idle_bs: int = 128
    w4_n: int = 256
    w4_rates: tuple[float, ...] = ()  # fixed rates besides saturation (W4 also names 4 req/s)
    w5_prefix: int = 4096
    w5_own: int = 8
    w5_out: int = 256
    w5_ns: tuple[int, ...] = (16, 64)
    host_bs: tuple[int, ...] = (32, 128, 256)
    host_ctx: int = 1024  # prompt tokens of each request in the host-time table
    host_steps: int = 128  # decode steps per request there
    page_sizes: tuple[int, ...] = (1, 16, 64)
    page_decode: tuple[int, int, int] = (64, 512, 128)  # requests, prompt, output
    chunk_sizes: tuple[int, ...] = (8192, 2048, 512)  # the default first: the shared W4 rate
    chunk_n: int = 128  # W1 and W4 requests per chunk size
    # W1L settings (ISL, OSL, N): as TensorRT-LLM publishes them (suite/w1l.py); one device call
    # of 10 min fits one of them at bf16 speed, so `--w1l` picks.
    w1l: tuple[tuple[int, int, int], ...] = ((1000, 1000, 3000), (128, 128, 30000))

    @staticmethod
    def full() -> Sizes:
        return Sizes()

    @staticmethod
    def quick() -> Sizes:
        return Sizes(
            correctness=(6, 40, 8),
            w1_n=12,
            w1_lo=8,
            w1_hi=48,
            peer_n=4,
            peer_max_out=4,
            peer_batches=(4, 2),
            peer_budget_s=30.0,
            w2=(64, 8, 8, 4),
            w2_turns=(4, 3, 8),
            w3_idle_bs=8,
            w4_n=12,
            w5_prefix=128,
            w5_own=8,
            w5_out=8,
            w5_ns=(4, 8),
            host_bs=(4, 8),
            host_ctx=32,
            host_steps=12,
            page_sizes=(1, 16),
            page_decode=(4, 40, 6),
            chunk_sizes=(64, 16),
            chunk_n=8,
            w1l=((24, 8, 6), (8, 8, 12)),
        )


@dataclass
class Ctx:
    target: Target
    rec: Recorder
    sizes: Sizes
    profile: bool = False  # cProfile the worker during W1 (printed)
    w1_tok_s: dict[str, float] = field(default_factory=dict)  # model name -> W1 complete() tok/s
