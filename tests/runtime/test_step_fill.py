"""The one-launch decode fill (radixserve/runtime/step_fill.py) equals the torch path.

The Triton kernel runs on the CPU under the interpreter (the session's subprocess,
tests/runtime/conftest.py), over step_fill_cases.py: padding rows, one request, a full graph,
contexts of many tiles, -1 ids, a random table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from step_fill_cases import CASES  # noqa: E402


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_step_fill_equals_build_decode_batch_with_graph_padding(triton_cpu_results: dict, name: str) -> None:
    diffs = triton_cpu_results["step_fill"][name]
    assert diffs == [], f"{name}: {diffs} differ from the torch path (seed {triton_cpu_results['seed']})"
