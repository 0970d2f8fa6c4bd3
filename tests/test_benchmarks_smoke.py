"""Smoke test of the benchmark helpers and of `bench_cpu.py --quick` (no timing thresholds)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load_common() -> Any:
    spec = importlib.util.spec_from_file_location("radixserve_bench_common", BENCH / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


common = _load_common()
W2_FULL, W2Shape, best_hit_rate = common.W2_FULL, common.W2Shape, common.best_hit_rate
format_table, w1_requests, w2_requests = common.format_table, common.w1_requests, common.w2_requests


def test_w1_is_deterministic_and_within_bounds() -> None:
    a = w1_requests(16, 16, 128, 49152)
    assert a == w1_requests(16, 16, 128, 49152, seed=0)
    assert a != w1_requests(16, 16, 128, 49152, seed=1)
    assert len(a) == 16
    for ids, out_len in a:
        assert 16 <= len(ids) <= 128 and 16 <= out_len <= 128
        assert all(0 <= t < 49152 for t in ids)
    # Lengths are drawn before ids, so they do not depend on the vocabulary.
    assert [(len(i), o) for i, o in a] == [(len(i), o) for i, o in w1_requests(16, 16, 128, 128256)]


def test_w1_draw_order_is_the_documented_one() -> None:
    import random

    random.seed(0)
    lengths = [(random.randint(100, 1024), random.randint(100, 1024)) for _ in range(3)]
    first_ids = [random.randint(0, 999) for _ in range(lengths[0][0])]
    reqs = w1_requests(3, 100, 1024, 1000)
    assert [(len(i), o) for i, o in reqs] == lengths
    assert reqs[0][0] == first_ids


def test_w2_shares_one_prefix() -> None:
    reqs = w2_requests(64, 8, 4, 3, 1000)
    assert reqs == w2_requests(64, 8, 4, 3, 1000)
    prefix = reqs[0][0][:64]
    for ids, out_len in reqs:
        assert len(ids) == 68 and ids[:64] == prefix and out_len == 3
    assert len({tuple(ids[64:]) for ids, _ in reqs}) == 8


def test_best_hit_rate() -> None:
    assert best_hit_rate(512, 1024, 32) == pytest.approx((512 * 1024 - 1024) / (512 * 1056))
    assert best_hit_rate(2, 10, 0) == pytest.approx(0.5)
    assert best_hit_rate(1, 100, 5) == 0.0
    assert W2Shape(256, 32, 16, 8).best_hit_rate() == pytest.approx(7936 / 8704)
    assert W2_FULL.scaled(0.5) == W2Shape(512, 256, 16, 16)


def test_format_table() -> None:
    text = format_table(["a", "bb"], [[1, 2.5], ["x", None]])
    lines = text.splitlines()
    assert lines[0] == "| a | bb    |" and len({len(line) for line in lines}) == 1


def test_bench_cpu_quick_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_cpu.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    for key in ("date", "commit", "versions", "machine", "results"):
        assert key in doc
    assert set(doc["versions"]) == {"python", "torch", "transformers", "radixserve"}
    w1, w2 = (r["figures"] for r in doc["results"])
    assert [r["workload"] for r in doc["results"]] == ["W1-cpu", "W2-cpu"]
    for fig in (w1["radixserve_overlap"], w1["radixserve_lockstep"], w2["cache_on"], w2["cache_off"]):
        _positive(fig)
    _positive(w1[f"hf_generate_b{4}"])
    assert "hf_continuous_batching" in w1 or w1["hf_continuous_batching_error"]
    for key in ("ratio_radixserve_vs_hf_generate_best", "ratio_overlap_vs_lockstep", "ratio_cache_on_vs_off"):
        assert (w1 | w2)[key] > 0
    assert w1["overlap_lockstep_same_tokens"] is True
    assert w2["outputs_identical_cache_on_off"] is True
    assert 0 < w2["hit_rate_best"] < 1
    for key in ("hit_rate_stats", "hit_rate_usage"):
        assert 0 <= w2[key] <= w2["hit_rate_best"] + 1e-9
    assert "| W2-cpu" in proc.stdout  # the table is printed


def _positive(fig: dict[str, Any]) -> None:
    assert fig["seconds"] > 0 and fig["tok_s"] > 0 and fig["output_tokens"] > 0
