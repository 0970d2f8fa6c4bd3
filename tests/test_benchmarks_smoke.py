"""Smoke test of the benchmark helpers and of `bench_cpu.py --quick` (no timing thresholds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from script_loader import BENCHMARKS, load_script

common = load_script(BENCHMARKS / "common.py", "radixserve_bench_common")
W2_FULL, W2Shape, best_hit_rate = common.W2_FULL, common.W2Shape, common.best_hit_rate
format_table, w1_requests, w2_requests = common.format_table, common.w1_requests, common.w2_requests


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/<name> args...` as a user runs it; it must exit 0."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


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
    proc = run_script("bench_cpu.py", "--quick", "--out", str(out))
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
    assert w1["mixed_steps"] is w2["mixed_steps"] is doc["mixed_steps"] is True  # the setting is recorded
    assert w2["outputs_identical_cache_on_off"] is True
    assert 0 < w2["hit_rate_best"] < 1
    for key in ("hit_rate_stats", "hit_rate_usage"):
        assert 0 <= w2[key] <= w2["hit_rate_best"] + 1e-9
    assert "| W2-cpu" in proc.stdout  # the table is printed


def test_bench_replicas_quick_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "replicas.json"
    proc = run_script("bench_replicas.py", "--quick", "--out", str(out))
    doc = json.loads(out.read_text())
    w8 = {r["setting"]: r["figures"] for r in doc["results"] if r["workload"] == "W8"}
    assert set(w8) == {"one engine", "cache-aware router", "round-robin"}
    for fig in w8.values():
        assert fig["same_tokens_as_one_engine"] == fig["requests"]  # greedy: the same tokens anywhere
        assert fig["output_tok_s"] > 0 and 0 <= fig["of_ideal"] <= 1
    assert w8["cache-aware router"]["decisions"]["prefix"] > 0
    assert w8["round-robin"]["decisions"]["round_robin"] > 0
    w1 = {r["mode"]: r["figures"] for r in doc["results"] if r["workload"] == "W1"}
    assert set(w1) == {"complete()", "streaming"} and all(f["ratio"] > 0 for f in w1.values())
    assert "| cache-aware router" in proc.stdout and "| streaming" in proc.stdout  # the tables


def test_tool_calls_quick_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "tool_calls.json"
    proc = run_script("tool_calls.py", "--quick", "--out", str(out))
    decode, parser = (r["figures"] for r in json.loads(out.read_text())["results"])
    for side in ("tool", "json"):
        assert (
            decode[side]["requests"] == 2 and decode[side]["tokens"] > 0 and decode[side]["ms_per_token"] > 0
        )
    assert decode["ratio_tool_over_json"] > 0
    assert set(parser) == {"hermes", "llama3", "mistral"}
    assert all(f["calls"] == 2 and f["us_per_token"] > 0 for f in parser.values())
    assert "tool call / json_schema time per token" in proc.stdout


def _positive(fig: dict[str, Any]) -> None:
    assert fig["seconds"] > 0 and fig["tok_s"] > 0 and fig["output_tokens"] > 0


# ---- provenance ---------------------------------------------------------------------------------


def test_bench_deterministic_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "det.json"
    args = ["--requests", "2", "--prompt", "8", "--tokens", "2", "--rounds", "2", "--out", str(out)]
    run_script("bench_deterministic.py", *args)
    doc = json.loads(out.read_text())
    assert len(doc["provenance"]["commit"]) == 40
    (res,) = doc["results"]
    assert res["args"]["rounds"] == 2
    assert set(res["modes"]) == {"default", "deterministic"}
    for mode in res["modes"].values():
        assert mode["alone_tok_s"] > 0 and mode["batch_tok_s"] > 0
    assert res["slowdown"]["batch_tok_s"] == pytest.approx(
        res["modes"]["default"]["batch_tok_s"] / res["modes"]["deterministic"]["batch_tok_s"]
    )


def test_profile_decode_end_to_end_with_fp8_and_an_override(tmp_path: Path) -> None:
    """The decode profiler on the CPU's tiny model with FP8 weights and an FP8 KV cache: it starts
    that engine, records the settings in its JSON, and the profiled steps give an op table."""
    out = tmp_path / "profile.json"
    args = ["--batch", "4", "--ctx", "32", "--steps", "3", "--quantization", "fp8"]
    args += ["--set", "kv_cache_dtype=fp8_e4m3", "--out", str(out)]
    run_script("profile_decode.py", *args)
    doc = json.loads(out.read_text())
    assert doc["quantization"] == "fp8" and doc["engine_overrides"] == {"kv_cache_dtype": "fp8_e4m3"}
    (res,) = doc["results"]
    assert res["batch"] == 4 and res["steps"] == 4 and res["wall_ms_per_step"] > 0
    assert any(op["name"] == "aten::mm" for op in res["cpu_ops"])


def test_provenance_from_git() -> None:
    prov = common.provenance()
    assert prov["commit_source"] == "git"
    assert len(prov["commit"]) == 40 and int(prov["commit"], 16) >= 0
    assert isinstance(prov["dirty"], bool)
    assert common.git_commit() in (prov["commit"], prov["commit"] + "-dirty")


def test_provenance_without_git_falls_back_to_the_env_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "radixserve").mkdir()
    (tmp_path / "radixserve" / "a.py").write_text("x = 1\n")
    monkeypatch.delenv(common.COMMIT_ENV, raising=False)
    prov = common.provenance(tmp_path)
    assert (prov["commit"], prov["dirty"], prov["commit_source"]) == (None, None, "unknown")
    monkeypatch.setenv(common.COMMIT_ENV, "abc1234")
    prov = common.provenance(tmp_path)
    assert prov["commit"] == "abc1234" and prov["dirty"] is None
    assert prov["commit_source"].startswith("env ") and "not verified" in prov["commit_source"]
    assert common.commit_label(prov) == "abc1234 (env)"
    before = prov["source_sha256"]
    (tmp_path / "radixserve" / "a.py").write_text("x = 2\n")
    assert common.provenance(tmp_path)["source_sha256"] != before


# ---- the GPU suite, on the CPU ------------------------------------------------------------------


def _load_suite(name: str) -> Any:
    sys.path.insert(0, str(BENCHMARKS.parent))
    import importlib

    return importlib.import_module(f"benchmarks.suite.{name}")


def test_suite_arithmetic() -> None:
    knobs = _load_suite("knobs")
    assert knobs.paged_waste([16, 32], 16) == 0.0
    assert knobs.paged_waste([17], 16) == pytest.approx(15 / 32)
    assert knobs.paged_waste([1, 1], 1) == 0.0
    # 2 turns of 4 tokens: prompts 4 and 4+4+4=12; turn 2 can reuse 4+4-1 = 7 tokens.
    assert knobs.multi_turn_best(2, 4) == pytest.approx(7 / 16)
    probes = _load_suite("probes")
    steps = [probes.Step(i, 0.01 * i, 2, 2, 10, True, [5, 5], 1e-3, 2e-3, 1e-3, 5e-3) for i in range(3)]
    prof = probes.host_profile(steps)
    assert prof["host_ms"] == pytest.approx(4.0) and prof["wait_ms"] == pytest.approx(5.0)
    assert prof["step_period_ms"] == pytest.approx(10.0) and prof["steps"] == 3


def test_w1l_settings_and_requests() -> None:
    w1l = _load_suite("w1l")
    assert w1l.parse_settings("1000/1000:3000,128/128:30000") == ((1000, 1000, 3000), (128, 128, 30000))
    with pytest.raises(ValueError, match="ISL/OSL:N"):
        w1l.parse_settings("1000:3000")
    reqs = w1l.w1l_requests(5, 7, 3, vocab=50)
    assert len(reqs) == 5 and all(len(ids) == 7 and n == 3 and max(ids) < 50 for ids, n in reqs)
    assert reqs == w1l.w1l_requests(5, 7, 3, vocab=50)  # seeded: every run asks the same


def test_fp8_linear_bench_reads_a_layers_shapes() -> None:
    pytest.importorskip("triton")
    bench = load_script(BENCHMARKS / "bench_fp8_linear.py", "radixserve_bench_fp8_linear")
    llama = bench.parse_shapes(bench.LLAMA_8B)
    assert llama == {
        "qkv_proj": (4096, 6144),
        "o_proj": (4096, 4096),
        "gate_up_proj": (4096, 28672),
        "down_proj": (14336, 4096),
    }
    assert bench.parse_shapes("128x256,down=512x64") == {"128x256": (128, 256), "down": (512, 64)}


def test_fp8_quant_sweep_times_the_engines_launch_shapes() -> None:
    pytest.importorskip("triton")
    sweep = load_script(BENCHMARKS / "sweep_fp8_quant.py", "radixserve_sweep_fp8_quant")
    assert sweep.parse_shapes("2048/4,4096/16") == [(2048, 4), (4096, 16)]
    from radixserve.runtime import fp8_quant

    # Each form's ratios are to the engine's current shape, so the default sweep must time it.
    shapes = sweep.parse_shapes(sweep.SHAPES)
    assert {fp8_quant.launch_shape(k, silu) for k, silu in ((14336, True), (4096, False))} <= set(shapes)


def test_gpu_steps_runs_each_step_within_the_call_deadline(tmp_path: Path) -> None:
    # From a folder without the wheel cache (.whl), as a fresh clone has: gpu_env.sh installs nothing.
    repo, out = tmp_path / "repo", tmp_path / "out"
    repo.mkdir()
    out.mkdir()
    for part in ("scripts", "benchmarks", "radixserve"):
        (repo / part).symlink_to(BENCHMARKS.parent / part)

    def steps(deadline: str, *specs: str) -> str:
        env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "DEADLINE": deadline}
        env["RADIXSERVE_SITE"] = str(tmp_path / "site")
        cmd = ["bash", "scripts/gpu_steps.sh", *specs]
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    shown = steps("300", "usage|120|--help")
    assert "usage rc 0" in shown and "--w1l" in (out / "usage.log").read_text()
    shown = steps("0", "late|120|--help")
    assert "late: skipped" in shown and not (out / "late.log").exists()


def test_gpu_suite_sections_are_selectable() -> None:
    sys.path.insert(0, str(BENCHMARKS.parent))
    import importlib

    suite = importlib.import_module("benchmarks.gpu_suite")
    assert suite.parse(["--only", "w5,pages"]).only_set == {"w5", "pages"}
    assert suite.parse([]).only_set == set(suite.SECTIONS)
    with pytest.raises(SystemExit):
        suite.parse(["--only", "w9"])


def test_gpu_suite_quantization_reaches_engines_records_and_bound(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCHMARKS.parent))
    import importlib

    suite = importlib.import_module("benchmarks.gpu_suite")
    assert suite.parse([]).quantization is None
    assert suite.parse(["--quantization", "fp8"]).quantization == "fp8"
    with pytest.raises(SystemExit):
        suite.parse(["--quantization", "int4"])
    engines = importlib.import_module("benchmarks.suite.engines")
    target = engines.Target("cpu", "float32", "dummy:llama-3.1-8b", "dummy:llama-3.1-8b", quantization="fp8")
    assert target.config("dummy:llama-3.1-8b").quantization == "fp8"
    report = importlib.import_module("benchmarks.suite.report")
    rec = report.Recorder([tmp_path / "r.jsonl"], "cpu", "float32", True, "fp8")
    rec("W1", "m", "1000/1000", "output_tok_s", 1.0)
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert line["setting"] == "1000/1000 fp8" and line["quantization"] == "fp8"
    # A second run into the same folder appends: the first run's record stays.
    again = report.Recorder([tmp_path / "r.jsonl"], "cpu", "float32", True)
    again("W1L", "m", "128/128", "output_tok_s", 21146.7)
    lines = [json.loads(raw) for raw in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["setting"] for r in lines] == ["1000/1000 fp8", "128/128"]
    bounds = importlib.import_module("benchmarks.suite.bounds")
    from radixserve.model.shapes import shape_hf_config

    hf, reqs = shape_hf_config("llama-3.1-8b"), [([1] * 100, 100)] * 8
    # FP8 linears read half the bytes of bf16 ones; embeddings and lm_head stay bf16.
    assert 1.4 < bounds.w1_bound(hf, reqs, quantization="fp8") / bounds.w1_bound(hf, reqs) < 2.0
    # The bound is for the card that ran: an H100's 3.35 TB/s, an H200's 4.8.
    tb = bounds.peak_tb_s("NVIDIA H100 80GB HBM3")
    assert (tb, bounds.peak_tb_s("NVIDIA H200")) == (3.35, 4.8)
    assert bounds.w1_bound(hf, reqs, hbm_tb_s=tb) == pytest.approx(bounds.w1_bound(hf, reqs) * tb / 4.8)


def test_gpu_suite_quick_on_the_cpu_end_to_end(tmp_path: Path) -> None:
    proc = run_script("gpu_suite.py", "--quick", "--device", "cpu", "--out", str(tmp_path))
    assert "FAILED" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The log says how long each engine took to start, and its kernel builds' progress.
    assert re.search(r"^engine \S+: started in \d+\.\d s$", proc.stdout, re.M), proc.stdout[-3000:]
    assert "radixserve: kernels ready" in proc.stderr, proc.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "suite_cpu_quick.jsonl").read_text().splitlines()]
    assert (tmp_path / "suite_cpu_quick.table.md").read_text().startswith("| workload")
    for r in recs:
        assert r["commit_source"] == "git" and len(r["commit"]) == 40 and isinstance(r["dirty"], bool)
        assert r["device"] == "cpu" and r["dtype"] == "float32" and r["quick"] is True
        assert r["command"].startswith("python3 benchmarks/gpu_suite.py --quick --device cpu")
    workloads = {r["workload"] for r in recs}
    assert workloads == {
        "correctness",
        "W1",
        "W1-peer",
        "W2",
        "W3",
        "W4",
        "W5",
        "host",
        "pages",
        "chunks",
        "W1-cold",
        "W1-sampled",
        "W1L",
    }

    def get(workload: str, setting: str, metric: str) -> dict[str, Any]:
        (hit,) = [
            r for r in recs if (r["workload"], r["setting"], r["metric"]) == (workload, setting, metric)
        ]
        return hit

    # float32 on the CPU: radixserve's greedy tokens are transformers' own.
    assert get("correctness", "backend=torch", "top1_agreement")["value"] == 1.0
    assert get("W1", "radixserve streaming", "output_tok_s")["value"] > 0
    # The cold first burst (the tiny model twice: small and large are one here): a start, its burst's
    # TTFT, and nothing compiled on the CPU's torch backend.
    cold = get("W1-cold", "radixserve start()", "start_s")
    assert cold["value"] > 0 and cold["files_built"] == 0 and cold["requests"] == 12
    burst = "first 12 W1 requests streamed after start, empty FlashInfer workspace"
    assert get("W1-cold", burst, "ttft_p50_ms")["value"] > 0
    assert get("W1-cold", burst, "files_built_by_burst")["value"] == 0
    ratio = [r for r in recs if r["workload"] == "W1-peer" and r["metric"] == "ratio"]
    assert len(ratio) == 1 and ratio[0]["swept"] and ratio[0]["value"] > 0
    # W5 (quick: prefix 128 + 8 own tokens, 8 out, N = 4 and 8), K/V read per step from kv_indices,
    # cascade off and on.
    # The figures come from the decode steps of all N rows, or where admission staggered them (a
    # loaded host: one request can finish before the last arrives) from the widest steps seen,
    # whose width the record's `decode_batch` gives: the bounds below are per such row.
    for n in (4, 8):
        off = get("W5", f"N={n} cascade=off", "output_tok_s")
        rows = off["decode_batch"]
        assert 0 < rows <= n
        kv = get("W5", f"N={n} cascade=off", "kv_bytes_per_decode_step")
        assert kv["bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 heads of 16, float32
        # Each row reads its prefix, own tokens and the 0-8 decoded so far.
        assert rows * (128 + 8) <= kv["kv_tokens"] <= rows * (128 + 8 + 8)
        assert kv["value"] == kv["kv_tokens"] * kv["bytes_per_token"]
        assert off["prefix_cached_frac"] == 1.0
        # Cascade on: every decode step groups its rows, so the 128-token prefix is read once.
        on = get("W5", f"N={n} cascade=on", "kv_bytes_per_decode_step")
        steps = get("W5", f"N={n} cascade=on", "output_tok_s")
        rows = steps["decode_batch"]
        assert 0 < rows <= n
        assert 128 + rows * 8 <= on["kv_tokens"] <= 128 + rows * (8 + 8)
        assert steps["cascade_steps"] >= steps["decode_steps"] > 0
        att = get("W5", f"N={n} cascade=on", "attention_ms_per_step")
        assert att["cascade_used"] and att["value"] > 0
    for bs in (4, 8):
        host = get("host", f"batch={bs} ctx=32", "host_ms_per_decode_step")
        assert host["value"] > 0 and host["steps"] > 0 and "missing_hooks" not in host
    p1, p16 = (get("pages", f"page={p}", "multi_turn_hit_rate") for p in (1, 16))
    assert 0 < p16["value"] < p1["value"] <= p1["bound"] + 1e-4  # values rounded to 4 places
    for p in (1, 16):
        assert get("pages", f"page={p}", "kv_slots_lost")["value"] == 0
        w2 = get("pages", f"page={p}", "w2_hit_rate")
        assert 0 < w2["value"] <= w2["bound"] + 1e-4
    assert get("pages", "page=1", "paged_pool_waste_frac")["value"] == 0.0
    rates = {r["rate"] for r in recs if r["workload"] == "chunks" and "rate" in r}
    assert len(rates) == 1  # every chunk size meets the same load
    # W1L (quick: 24/8 x 6 and 8/8 x 12), named by the setting, beside the pool's capacity.
    for setting, n in (("24/8", 6), ("8/8", 12)):
        w1l = get("W1L", setting, "output_tok_s")
        assert w1l["value"] > 0 and w1l["requests"] == n and w1l["kv_total_slots"] > 0
        assert w1l["max_running_requests"] == 256 and w1l["retractions"] >= 0


def test_step_probe_finds_its_hooks_or_falls_back() -> None:
    from types import SimpleNamespace

    probes = _load_suite("probes")
    batch = SimpleNamespace(extend_lens=[1, 1], prefix_lens=[3, 4])
    calls: list[str] = []

    def make(with_worker_hooks: bool) -> Any:
        sched = SimpleNamespace(schedule=lambda inflight=False: batch, process=lambda b, r: calls.append("p"))
        runner = SimpleNamespace(launch=lambda fb: calls.append("l"))
        worker = SimpleNamespace(scheduler=sched, runner=runner)
        if with_worker_hooks:
            worker._launch = lambda b: runner.launch(b)
            worker._finish_step = lambda b, h: sched.process(b, None)
        return SimpleNamespace(_worker=worker)

    for hooks in (True, False):
        engine = make(hooks)
        probe = probes.StepProbe.attach(engine)
        w = engine._worker
        b = w.scheduler.schedule()
        (w._launch if hooks else w.runner.launch)(b)
        assert probe.decode_steps(2) == []  # launched, outputs not processed yet
        if hooks:
            w._finish_step(b, SimpleNamespace(event=None))
        else:
            w.scheduler.process(b, None)
        (step,) = probe.decode_steps(2)
        assert (step.kv_tokens, step.kv_lens, step.num_tokens) == (9, [4, 5], 2)
        assert probe.missing == ([] if hooks else ["Worker._finish_step (wait not measured)"])
    assert calls == ["l", "p", "l", "p"]


def test_results_cited_in_the_docs_exist() -> None:
    """BENCHMARKS.md, the README and docs/ cite results files that exist; the results folder
    keeps the current records only (at most 40 files; git history keeps the rest)."""
    import re

    root = BENCHMARKS.parent
    results = root / "benchmarks" / "results"
    files = [p for p in results.rglob("*") if p.is_file()]
    assert len(files) <= 40, len(files)
    names = {p.name for p in files}
    missing = []
    for doc in [root / "BENCHMARKS.md", root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in re.finditer(r"benchmarks/results/([\w.\-/]+)", text):
            rel = m.group(1).rstrip(".")
            cited = rel and not rel.endswith("/") and text[m.end() : m.end() + 1] not in "<{"
            if cited and not (results / rel).exists():
                missing.append(f"{doc.name}: benchmarks/results/{rel}")
        if doc.name == "BENCHMARKS.md":  # bare names of result files, and dated run folders
            for m in re.finditer(r"`([\w.\-/]+\.(?:json|jsonl|log|txt))`", text):
                name = m.group(1)
                if not name.startswith(("/", "$", "../")) and name.split("/")[-1] not in names:
                    missing.append(f"{doc.name}: {name}")
            for m in re.finditer(r"`(\d{4}-\d\d-\d\d-[0-9a-f]{7,})/", text):
                if not (results / m.group(1)).is_dir():
                    missing.append(f"{doc.name}: {m.group(1)}/")
    assert not missing, missing


def test_correctness_on_a_shape_cut_to_its_first_layers(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from benchmarks.suite.correctness import truncated

    folder = truncated("dummy:gemma-3-12b", 8, tmp_path)
    cfg = AutoConfig.from_pretrained(folder)
    assert Path(folder).name == "gemma-3-12b-8-layers"
    assert cfg.num_hidden_layers == 8 and len(cfg.layer_types) == 8
    assert cfg.layer_types[5] == "full_attention" and cfg.layer_types[6] == "sliding_attention"
    assert truncated("dummy:qwen2.5-0.5b", 100, tmp_path) == "dummy:qwen2.5-0.5b"  # no cut to make
