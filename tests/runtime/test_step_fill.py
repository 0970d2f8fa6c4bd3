"""The one-launch decode fill (radixserve/runtime/step_fill.py) equals the torch path.

The Triton kernel runs on the CPU under the interpreter (the session's subprocess,
tests/runtime/conftest.py), over step_fill_cases.py: padding rows, one request, a full graph,
contexts of many tiles, -1 ids, a random table. On the GPU (`-m gpu`) the compiled kernel,
over the same cases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from step_fill_cases import CASES, run_step_fill_cases  # noqa: E402


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_step_fill_equals_build_decode_batch_with_graph_padding(triton_cpu_results: dict, name: str) -> None:
    diffs = triton_cpu_results["step_fill"][name]
    assert diffs == [], f"{name}: {diffs} differ from the torch path (seed {triton_cpu_results['seed']})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_step_fill_equals_the_torch_path() -> None:
    diffs = run_step_fill_cases(seed=0, device="cuda")
    assert all(d == [] for d in diffs.values()), diffs
