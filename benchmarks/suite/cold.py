"""W1-cold: the first burst after start on a fresh machine (benchmarks/cold_start.py), in a child
process whose FlashInfer workspace is a new empty folder (FlashInfer reads it at import, so not in
this process, whose imports are warm). Records start() seconds, the burst's TTFT, and how many
workspace files the burst added (0: start-up built every module the burst ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.suite.context import Ctx

SCRIPT = Path(__file__).resolve().parent.parent / "cold_start.py"


def cold(ctx: Ctx, spec: str) -> None:
    t, s = ctx.target, ctx.sizes
    name = t.name(spec)
    with tempfile.TemporaryDirectory(prefix="fi-cold-") as ws:
        argv = [sys.executable, str(SCRIPT), "--model", spec, "--device", t.device, "--dtype", t.dtype]
        argv += ["--requests", str(s.w1_n), "--lo", str(s.w1_lo), "--hi", str(s.w1_hi)]
        if t.kv_cache_tokens is not None:
            argv += ["--kv-cache-tokens", str(t.kv_cache_tokens)]
        env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": ws}
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"cold_start.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for line in out["progress"]:
        print(f"[W1-cold] {name} {line}", flush=True)
    # Modules shipped precompiled load instead of compiling: the start is as cold as that is empty.
    notes = {"aot_modules": out["aot_modules"], "requests": out["requests"]}
    setting = f"first {out['requests']} W1 requests streamed after start, empty FlashInfer workspace"
    ctx.rec(
        "W1-cold",
        name,
        "radixserve start()",
        "start_s",
        out["start_s"],
        files_built=len(out["files_by_start"]),
        **notes,
    )
    ctx.rec("W1-cold", name, setting, "ttft_p50_ms", out["ttft_p50_ms"], **notes)
    ctx.rec("W1-cold", name, setting, "ttft_p99_ms", out["ttft_p99_ms"], **notes)
    ctx.rec("W1-cold", name, setting, "files_built_by_burst", len(out["files_by_burst"]), target=0, **notes)
