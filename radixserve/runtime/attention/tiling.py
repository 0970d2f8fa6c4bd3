"""`DecodeTiling`: how the Triton decode kernel cuts its work. Its own module, without
triton, so that step data (`ForwardBatch.graph`) and the split rule (`triton_decode.py`)
name it without importing the kernels."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeTiling:
    """How the decode kernel cuts its work.

    `splits` programs per (request, KV head), each over `ceil(len / splits)`
    keys (a context shorter than `splits` leaves the last splits empty: they
    write only a -inf log-sum-exp); `block_n` keys per tile; `num_stages` Triton's
    software pipelining depth (0: Triton's default). Over an FP8 pool with bfloat16
    queries, `fp8_f16` upcasts the tiles to float16 (q too, clamped to its range) instead
    of bfloat16: e4m3 -> float16 is one conversion per pair on sm89+, e4m3 -> bfloat16 a
    longer sequence. `benchmarks/gpu_decode_fp8.py` on an H100 (256 rows of 1,500 tokens):
    llama-3.1-8b's layer 0.313 ms with float16 tiles against 0.398 with bfloat16 (1.27x;
    bf16 pool: 0.518), qwen2.5-0.5b's 0.069 against 0.077, and closer to the float32
    reference (float16 keeps 3 more mantissa bits than bfloat16).
    """

    splits: int = 1
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 0
    fp8_f16: bool = True
