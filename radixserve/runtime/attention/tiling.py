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
    write only a -inf log-sum-exp); `block_n` keys per tile.
    """

    splits: int = 1
    block_n: int = 64
    num_warps: int = 4
