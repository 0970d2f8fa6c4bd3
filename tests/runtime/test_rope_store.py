"""The one-launch rotary + K/V store (radixserve/runtime/attention/kv_store.py) equals the
model's rope followed by `KVPool.write`, over rope_store_cases.py: strided views, head counts
that are not powers of two, a partial rotary, an FP8 pool, an empty step, a fallback layout.

On the CPU the Triton kernel runs under the interpreter (the session's subprocess,
tests/runtime/conftest.py); on the GPU (`-m gpu`) compiled, over the same cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from rope_store_cases import CASES, RopeCase, run_case, tolerance  # noqa: E402


def _check(case: RopeCase, diffs: dict[str, float], seed: int) -> None:
    for part in ("q", "k", "v"):
        assert diffs[part] <= tolerance(case, part), f"{case.name}: {part} off by {diffs[part]} (seed {seed})"
    assert diffs["v"] == 0.0, f"{case.name}: v is copied, not computed (seed {seed})"
    assert diffs["k_untouched"] == 0.0 and diffs["v_untouched"] == 0.0, f"{case.name}: other slots written"
    assert diffs.get("fp8_bytes_off", 0.0) == 0.0, (
        f"{case.name}: FP8 bytes differ from the quantized bf16 pool's"
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rope_store_equals_rope_then_pool_write(triton_cpu_results: dict, case: RopeCase) -> None:
    _check(case, triton_cpu_results["rope_store"][case.name], triton_cpu_results["seed"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_compiled_rope_store_equals_rope_then_pool_write(case: RopeCase) -> None:
    _check(case, run_case(case, "cuda", seed=0), 0)
