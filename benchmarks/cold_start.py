"""The first burst on a fresh machine: start an engine, then stream a burst of W1 requests, and
say what FlashInfer compiled when. Run it with an empty FlashInfer workspace to measure a cold
start (FlashInfer reads the variable when imported, so it must be set before this process):

    source scripts/gpu_env.sh   # on the GPU machine
    FLASHINFER_WORKSPACE_BASE=$(mktemp -d) python3 benchmarks/cold_start.py --model dummy:qwen2.5-0.5b

Prints one JSON object (last line): start() seconds, the burst's TTFT p50/p99 and tokens per
second, the start-up's progress lines, the files of the FlashInfer workspace after start() and
those the burst added (empty when start-up built every module), and how many modules the
flashinfer install ships precompiled (`flashinfer/data/aot`, which scripts/gpu_env.sh fills from
.fi_cache: those load instead of compiling, so the start is only as cold as that folder is empty).
benchmarks/suite/cold.py runs it in the GPU suite (`--only cold`); tests/runtime/test_warm_up_gpu.py
runs it on a tiny checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import w1_requests  # noqa: E402
from benchmarks.suite.engines import hf_config, load_format, p50_p99_ms, run_streaming  # noqa: E402
from radixserve import AsyncEngine, EngineConfig  # noqa: E402


class Lines(logging.Handler):
    """The engine's progress lines, kept."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def workspace() -> Path:
    """FlashInfer's JIT folder, as flashinfer.jit.env finds it."""
    return Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def aot_modules() -> int | None:
    """Precompiled modules the flashinfer install ships; None without flashinfer."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or spec.origin is None:
        return None
    return len(list((Path(spec.origin).parent / "data" / "aot").glob("*/*.so")))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model spec: dummy:<shape>, a folder")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--decode-kernel", default="auto")
    ap.add_argument("--requests", type=int, default=256, help="W1 requests in the burst")
    ap.add_argument("--lo", type=int, default=100, help="W1's shortest input and output")
    ap.add_argument("--hi", type=int, default=1024, help="W1's longest input and output")
    ap.add_argument("--kv-cache-tokens", type=int, default=None)
    return ap.parse_args(argv)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    lines = Lines()
    logger = logging.getLogger("radixserve")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    cfg = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        load_format=load_format(args.model),
        attention_backend=args.attention_backend,
        decode_kernel=args.decode_kernel,
        **({"kv_cache_tokens": args.kv_cache_tokens} if args.kv_cache_tokens else {}),
    )
    reqs = w1_requests(args.requests, args.lo, args.hi, int(hf_config(args.model).vocab_size))
    root = workspace()
    before = files(root)
    loop = asyncio.new_event_loop()
    engine = AsyncEngine(cfg)
    t0 = time.perf_counter()
    loop.run_until_complete(engine.start())
    start_s = time.perf_counter() - t0
    after_start = files(root)
    try:
        streamed = run_streaming(engine, loop, reqs)
    finally:
        loop.run_until_complete(engine.shutdown(drain=False))
        loop.close()
    after_burst = files(root)
    ttft_p50, ttft_p99 = p50_p99_ms(streamed.ttft)
    return {
        "start_s": round(start_s, 2),
        "ttft_p50_ms": round(ttft_p50, 1),
        "ttft_p99_ms": round(ttft_p99, 1),
        "output_tok_s": round(streamed.tok_s, 1),
        "requests": len(reqs),
        "progress": lines.lines,
        "workspace": str(root),
        "files_before_start": len(before),
        "files_by_start": sorted(after_start - before),
        "files_by_burst": sorted(after_burst - after_start),
        "aot_modules": aot_modules(),
    }


if __name__ == "__main__":
    print(json.dumps(measure(parse())))
