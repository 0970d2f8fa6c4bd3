"""Shared-prefix (cascade) decode attention on the GPU: correctness first, then its speed-up.

    source scripts/gpu_env.sh && PYTHONUNBUFFERED=1 python3 benchmarks/gpu_cascade_check.py

1. Correctness, bfloat16: the FlashInfer cascade path (level 0: each group's
   shared prefix once, level 1: each row's own suffix, merged with
   `merge_state_in_place`) against FlashInfer's plain decode on the same
   batch, and both against the float32 torch reference; the torch cascade
   path against torch plain on the GPU too. Batches: one group of all rows
   (rows in order: the merge runs in place), and groups with interleaved rows
   plus singletons (the gather/scatter path), on Llama-8B and Qwen-0.5B heads.
2. Timing (triton.testing.do_bench, median ms of one layer's forward: K/V
   write + attention): W5's shape at its middle step (4096-token shared
   prefix, 8 + 128 own tokens per row) at N = 16 and 64, plain against
   cascade, with the K/V bytes each reads per layer.
3. Prints a table, writes $OUT/cascade_check.json, packs the compiled
   FlashInfer modules (the cascade module is new) into $OUT/fi_cache.tgz*,
   and exits 1 if any error is over the bfloat16 bound or any case failed.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import print_error_rows, provenance  # noqa: E402
from benchmarks.gpu_attention_check import (  # noqa: E402
    BF16_TOL,
    DTYPE,
    LLAMA_8B,
    QWEN_05B,
    Shape,
    make_backend,
    make_pool,
    median_layer_ms,
    pack_flashinfer_cache,
    rel_err,
    versions,
)
from radixserve.cache.kv_pool import KVPool, KVPoolConfig  # noqa: E402
from radixserve.runtime.cascade import CascadeGroups  # noqa: E402
from radixserve.runtime.forward_batch import ForwardBatch  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))

# (groups as (rows, shared prefix length), per-row own tokens incl. the decoded one)
CASES: dict[str, tuple[list[tuple[list[int], int]], list[int]]] = {
    "one_group_16x4096": ([(list(range(16)), 4096)], [9 + 8 * i for i in range(16)]),
    "interleaved_and_singletons": (
        [([0, 2, 5, 7], 700), ([1, 4], 300)],
        [1, 5, 130, 2, 1, 77, 3000, 40],
    ),
}


def cascade_batch(groups: list[tuple[list[int], int]], own: list[int]) -> tuple[ForwardBatch, int]:
    """A decode batch whose grouped rows start with the same scattered slots, and the slots it needs."""
    need = sum(p for _, p in groups) + sum(own)
    take = iter(torch.randperm(need).tolist())
    ctx: list[list[int]] = [[] for _ in own]
    for rows, p in groups:
        shared = [next(take) for _ in range(p)]
        for r in rows:
            ctx[r] = list(shared)
    for r, n in enumerate(own):
        ctx[r] += [next(take) for _ in range(n)]
    b = len(own)
    fb = ForwardBatch.build(
        torch.zeros(b, dtype=torch.int64),
        [1] * b,
        [len(c) - 1 for c in ctx],
        [torch.tensor(c) for c in ctx],
        device="cuda",
    )
    fb.cascade = CascadeGroups(tuple(tuple(g) for g, _ in groups), tuple(p for _, p in groups))
    return fb, need


def plain(fb: ForwardBatch) -> ForwardBatch:
    return ForwardBatch(**{**fb.__dict__, "cascade": None})


def check(shape: Shape, case: str, layers: int = 2) -> dict[str, float]:
    groups, own = CASES[case]
    fb, slots = cascade_batch(groups, own)
    pool = make_pool(shape, slots, layers)
    cfg32 = KVPoolConfig(layers, shape.num_kv_heads, shape.head_dim, dtype=torch.float32, device="cuda")
    pool32 = KVPool(cfg32, slots)
    for layer in range(layers):
        pool32.k[layer].copy_(pool.k[layer])
        pool32.v[layer].copy_(pool.v[layer])
    runs = {
        "fi_cascade": (make_backend("flashinfer", pool, shape), fb),
        "fi_plain": (make_backend("flashinfer", pool, shape), plain(fb)),
        "torch_cascade": (make_backend("torch", pool32, shape), fb),
        "ref": (make_backend("torch", pool32, shape), plain(fb)),
    }
    for backend, batch in runs.values():
        backend.plan(batch)
    assert getattr(runs["fi_cascade"][0], "_shared_active", None) is not None, "cascade path not planned"
    worst = {"fi_cascade_vs_ref": 0.0, "fi_plain_vs_ref": 0.0, "fi_cascade_vs_fi_plain": 0.0}
    worst["torch_cascade_vs_ref"] = 0.0
    b = fb.batch_size
    for layer in range(layers):
        q = torch.randn(b, shape.num_heads, shape.head_dim, device="cuda", dtype=DTYPE)
        k = torch.randn(b, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=DTYPE)
        v = torch.randn(b, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=DTYPE)
        out = {}
        for name, (backend, batch) in runs.items():
            bf16 = name.startswith("fi_")
            out[name] = backend.forward(q if bf16 else q.float(), k, v, layer, batch)
        for key in worst:
            a, ref = key.split("_vs_")
            worst[key] = max(worst[key], rel_err(out[a], out[ref]))
    return worst


def bench(shape: Shape, n: int, cascade: bool, layers: int = 4) -> float:
    fb, slots = cascade_batch([(list(range(n)), 4096)], [8 + 128] * n)
    batch = fb if cascade else plain(fb)
    pool = make_pool(shape, slots, layers)
    backend = make_backend("flashinfer", pool, shape)
    backend.plan(batch)
    return median_layer_ms(backend, batch, shape, layers)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    assert torch.cuda.is_available(), "needs a CUDA device"
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    report: dict[str, Any] = {"workload": "cascade_check", "versions": versions(), **provenance()}
    failed: list[str] = []
    errors: dict[str, Any] = {}
    for shape in (LLAMA_8B, QWEN_05B):
        for case in CASES:
            key = f"{shape.name}/{case}"
            try:
                errors[key] = check(shape, case)
            except Exception as e:  # noqa: BLE001 - report every case, then fail
                traceback.print_exc()
                errors[key] = f"{type(e).__name__}: {e}"
                failed.append(key)
                continue
            failed += [f"{key}/{k}" for k, err in errors[key].items() if not 0 <= err < BF16_TOL]
    report["rel_err"] = errors
    timings: dict[str, Any] = {}
    per_token = LLAMA_8B.num_kv_heads * LLAMA_8B.head_dim * 2 * 2  # K and V, bf16, one layer
    for n in (16, 64):
        try:
            off, on = bench(LLAMA_8B, n, False), bench(LLAMA_8B, n, True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            timings[f"N={n}"] = f"{type(e).__name__}: {e}"
            failed.append(f"timing N={n}")
            continue
        timings[f"N={n}"] = {
            "plain_ms": off,
            "cascade_ms": on,
            "speedup": off / on,
            "plain_kv_bytes": n * (4096 + 136) * per_token,
            "cascade_kv_bytes": (4096 + n * 136) * per_token,
        }
    report["w5_layer_attention"] = timings
    report["failed"] = failed
    report["fi_cache"] = pack_flashinfer_cache(OUT)
    (OUT / "cascade_check.json").write_text(json.dumps(report, indent=2))
    rows = [
        (f"{key}/{k}", err)
        for key, errs in errors.items()
        for k, err in (errs.items() if isinstance(errs, dict) else [("error", errs)])
    ]
    print_error_rows("correctness (bf16; rel err)", rows, BF16_TOL, width=60)
    print(f"\n{'W5 middle step, Llama-8B heads, one layer':<44} {'plain ms':>9} {'cascade ms':>11} {'x':>6}")
    for key, t in timings.items():
        if isinstance(t, dict):
            print(f"{key:<44} {t['plain_ms']:>9.4f} {t['cascade_ms']:>11.4f} {t['speedup']:>6.2f}")
        else:
            print(f"{key:<44} {t}")
    print("\nFAILED: " + ", ".join(failed) if failed else "\nall cascade checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
