"""The GPU suite: correctness against transformers, W1-W5, the host time per decode step, and the
two operator questions (page size, prefill chunk size), in one run.

On the GPU machine, from the repository root (see the README's GPU section):

    source scripts/gpu_env.sh && python3 benchmarks/gpu_suite.py --out "$OUT"

On a CPU, a smoke run of every section with a tiny random Llama (seconds):

    python benchmarks/gpu_suite.py --quick --device cpu --out /tmp/suite

`--only w5,pages,...` picks sections (names below). `--quantization fp8` runs every
engine with FP8 weights (docs/fp8.md): each record then carries `"quantization": "fp8"`,
its setting ends in " fp8", and the file is `h200_fp8.jsonl`; the transformers peer
stays unquantized on the same weights. `--deterministic` likewise runs every engine with
`EngineConfig(deterministic=True)` (docs/deterministic.md): records carry `"deterministic": true`,
settings end in " deterministic", the file is `h200_deterministic.jsonl`. Each record is one JSON
line in `<out>/h200.jsonl` (`suite_cpu.jsonl` on the CPU, `_quick` added
for --quick), appended as it is measured (runs into one folder keep each other's), with the
commit and dirty flag the script takes itself and the command line that ran it; a table of every figure
is printed last and written beside it (`.table.md`). Workloads are those of BENCHMARKS.md ("Workloads");
the transformers peer runs in the same process on the same weights.

Sections (model; seconds on one H200, estimated from earlier runs):
correctness (tiny, qwen2.5-0.5b, llama-3.1-8b; ~80), w1 (both, with the
peer's sweep; ~150), w1s (both: W1 sampled at temperature 0.8, top_p 0.95,
seeded, and greedy W1 again on the same engine; ~60), w1l (llama: TensorRT-LLM's protocol,
1000/1000 × 3000 and 128/128 × 30000, suite/w1l.py; a 1000/1000 setting takes a call of its
own: ~6-8 min in bf16, 1,000 requests ran past 200 s on an H100), w2 (llama; ~25), w3 (qwen; ~45),
w4 (llama, mixed steps and prefill first, each with its W1; ~150), w5
(llama, cascade off then on: two engines; ~50), host (qwen; ~15), pages (llama; ~50), chunks (llama; ~90),
cold (both: start() with an empty FlashInfer workspace, then 256 W1 requests streamed, TTFT
p50 of that first burst; suite/cold.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suite import cold, decode, knobs, w1l, workloads  # noqa: E402
from benchmarks.suite import correctness as corr  # noqa: E402
from benchmarks.suite.context import Ctx, Sizes  # noqa: E402
from benchmarks.suite.engines import free_memory, make_target, parse_override  # noqa: E402
from benchmarks.suite.report import Recorder  # noqa: E402

SECTIONS = ("correctness", "w1", "w1s", "w1l", "w2", "w3", "w4", "w5", "host", "pages", "chunks", "cold")
RESULTS = Path(__file__).resolve().parent / "results"


def run_section(ctx: Ctx, name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - one failed section must not hide the others
        traceback.print_exc()
        ctx.rec.failed(name, e)
    print(f"-- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    free_memory()


def plan(ctx: Ctx, only: set[str], correctness_layers: int = 0) -> list[tuple[str, Callable[[], Any]]]:
    t = ctx.target
    small, large = t.small, t.large
    models = [small] if small == large else [small, large]
    steps: list[tuple[str, Callable[[], Any]]] = []
    if "correctness" in only:
        if t.device == "cuda":
            tiny = corr.tiny_checkpoint(Path("/tmp/radixserve-suite/tiny-random-llama"))
            steps.append(
                ("correctness tiny", partial(corr.correctness, ctx, tiny, ["flashinfer", "triton", "torch"]))
            )
            root = Path("/tmp/radixserve-suite")
            for m in models:
                spec = corr.truncated(m, correctness_layers, root) if correctness_layers else m
                steps.append(
                    (f"correctness {spec}", partial(corr.correctness, ctx, spec, ["flashinfer", "triton"]))
                )
        else:
            steps.append(("correctness", partial(corr.correctness, ctx, small, ["torch"])))
    sections: list[tuple[str, Callable[[Ctx, str], None], list[str]]] = [
        ("w1", workloads.w1, models),
        ("w1s", workloads.w1_sampled, models),
        ("w1l", w1l.w1l, [large]),
        ("w2", workloads.w2, [large]),
        ("w3", workloads.w3, [small]),
        ("w4", workloads.w4, [large]),
        ("w5", decode.w5, [large]),
        ("host", decode.host_steps, [small]),
        ("pages", knobs.pages, [large]),
        ("chunks", knobs.chunks, [large]),
        ("cold", cold.cold, models),
    ]
    for key, fn, specs in sections:
        if key in only:
            steps += [(f"{key} {t.name(m)}", partial(fn, ctx, m)) for m in specs]
    return steps


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(RESULTS), help="folder for the JSONL")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, figures mean nothing")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--only", default="", help=f"comma list of: {','.join(SECTIONS)} (default: all)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the worker in W1 and at the host table's largest batch",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an EngineConfig field for every engine, e.g. decode_kernel=flashinfer (recorded)",
    )
    ap.add_argument("--name", default="", help="file stem (default: h200 / gpu / suite_cpu, + _quick)")
    ap.add_argument("--w4-rates", default="", help="fixed W4 rates besides saturation, e.g. 4 (~70 s each)")
    ap.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="EngineConfig.stream_interval of the engines (W1's streaming figure: an output every N tokens)",
    )
    ap.add_argument(
        "--models",
        default="",
        help="SMALL[,LARGE] model specs instead of the defaults, e.g. dummy:qwen3-30b-a3b (one: both)",
    )
    ap.add_argument(
        "--quantization",
        choices=["fp8"],
        default=None,
        help="EngineConfig.quantization of every engine (recorded; settings end in ' fp8')",
    )
    ap.add_argument(
        "--correctness-layers",
        type=int,
        default=0,
        help="correctness on the models' first N layers (for shapes whose float32 twin does not fit)",
    )
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="EngineConfig.deterministic of every engine (recorded; settings end in ' deterministic')",
    )
    ap.add_argument("--chunk-sizes", default="", help="e.g. 512,1024,2048,4096,8192 (default 8192,2048,512)")
    ap.add_argument(
        "--w1l",
        type=w1l.parse_settings,  # a malformed setting is a usage error, not a traceback
        default=(),
        help="W1L settings ISL/OSL:N, e.g. 1000/1000:1000 (default 1000/1000:3000,128/128:30000)",
    )
    args = ap.parse_args(argv)
    args.only_set = set(filter(None, args.only.split(","))) or set(SECTIONS)
    unknown = args.only_set - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    # The engine's start-up lines (one per kernel build, with its seconds) into the log: on a
    # fresh machine they say where a start's minutes go.
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("radixserve").setLevel(logging.INFO)
    target = replace(
        make_target(args.device),
        stream_interval=args.stream_interval,
        quantization=args.quantization,
        deterministic=args.deterministic,
    )
    if args.set:
        target = replace(target, overrides=tuple(parse_override(kv) for kv in args.set))
    if args.models:
        specs = args.models.split(",")
        target = replace(target, small=specs[0], large=specs[-1])
    if target.device == "cpu" and args.quick:
        torch.set_num_threads(1)  # tiny ops: OpenMP fork/join on a shared CPU costs more than it gives
    sizes = Sizes.quick() if args.quick else Sizes.full()
    if args.chunk_sizes:
        # Largest first: without W1 in the run, the first size's W1 sets the one W4 rate.
        chunk_sizes = tuple(sorted({int(c) for c in args.chunk_sizes.split(",")}, reverse=True))
        sizes = replace(sizes, chunk_sizes=chunk_sizes)
    if args.w4_rates:
        sizes = replace(sizes, w4_rates=tuple(float(r) for r in args.w4_rates.split(",")))
    if args.w1l:
        sizes = replace(sizes, w1l=args.w1l)
    gpu = target.device == "cuda" and "H200" in torch.cuda.get_device_name()
    stem = ("h200" if gpu else "gpu" if target.device == "cuda" else "suite_cpu") + (
        "_quick" if args.quick else ""
    )
    if target.quantization is not None:
        stem += f"_{target.quantization}"
    if target.deterministic:
        stem += "_deterministic"
    out = Path(args.out) / f"{args.name or stem}.jsonl"
    rec = Recorder([out], target.device, target.dtype, args.quick, target.quantization, target.deterministic)
    head = rec.head
    # The command that reproduces these records (from the repository root; on the GPU machine
    # after `source scripts/gpu_env.sh`).
    ran = sys.argv[1:] if argv is None else argv
    head["command"] = shlex.join(["python3", "benchmarks/gpu_suite.py", *ran])
    if target.overrides:
        head["engine_overrides"] = dict(target.overrides)
    print(f"suite: {target}, commit {head['commit']} ({head['commit_source']}, dirty={head['dirty']})")
    ctx = Ctx(target, rec, sizes, profile=args.profile)
    t_all = time.perf_counter()
    for name, fn in plan(ctx, args.only_set, args.correctness_layers):
        run_section(ctx, name, fn)
    table = rec.table()
    out.with_suffix(".table.md").write_text(table + "\n")
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s; {len(rec.records)} records -> {out}\n")
    print(table, flush=True)
    return out


if __name__ == "__main__":
    main()
