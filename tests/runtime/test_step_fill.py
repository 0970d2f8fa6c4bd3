"""The one-launch decode fill (radixserve/runtime/step_fill.py) equals the torch path.

The Triton kernel runs on the CPU under TRITON_INTERPRET=1 in a subprocess (the flag must be
set before triton defines the kernel and must not leak into this process), over the cases of
step_fill_cases.py: padding rows, one request, a full graph, contexts of many tiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from step_fill_cases import CASES  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "step_fill_cases.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_step_fill_equals_build_decode_batch_with_graph_padding(interpreted: dict, name: str) -> None:
    diffs = interpreted["diffs"][name]
    assert diffs == [], f"{name}: {diffs} differ from the torch path (seed {interpreted['seed']})"
