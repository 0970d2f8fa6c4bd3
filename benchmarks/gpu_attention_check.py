"""Attention backends on the GPU: correctness against the torch reference in
bfloat16 on model head layouts, then per-call timings; one run on the device.

    source scripts/gpu_env.sh && PYTHONUNBUFFERED=1 python3 benchmarks/gpu_attention_check.py

1. Builds FlashInfer's kernels for every configuration used below at once
   (threads; each build is a ninja of nvcc jobs), timing it.
2. Correctness: Triton and FlashInfer (tensor-core decode and, for Llama, the
   CUDA-core decode) against the float32 torch reference, on mixed extend
   batches (cached prefixes + new tokens + decodes) and decode batches:
   ‖out − ref‖ / ‖ref‖, fresh random inputs.
3. Timings (triton.testing.do_bench, median ms): decode at B=64, ctx 1024,
   and an extend batch (4 × 1024 new tokens on 1024-token prefixes), with the
   KV read rate or attention TFLOP/s they imply. Calls rotate over layers of
   the pool so the KV does not sit in L2.
4. Prints a table last, writes $OUT/attention_check.json, and packs the
   compiled FlashInfer modules into $OUT/fi_cache.tgz (split into
   fi_cache.tgz.NN parts if over 15 MiB) for scripts/gpu_env.sh to reuse.
"""

from __future__ import annotations

import io
import json
import os
import platform
import sys
import tarfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import commit_label, print_error_rows, provenance  # noqa: E402
from radixserve.cache.kv_pool import KVPool, KVPoolConfig  # noqa: E402
from radixserve.runtime.attention import AttentionBackend, TorchAttention  # noqa: E402
from radixserve.runtime.forward_batch import ForwardBatch  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
DTYPE = torch.bfloat16
BF16_TOL = 1.5e-2
PART_BYTES = 15 << 20


@dataclass(frozen=True)
class Shape:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


LLAMA_8B = Shape("llama-3.1-8b", 32, 8, 128)
QWEN_05B = Shape("qwen2.5-0.5b", 14, 2, 64)

# (prefix, extend) per request. Mixed: long and short prefills, a chunk on a
# long cached prefix, decodes among them.
MIXED = [(0, 512), (1024, 128), (700, 1), (0, 1), (100, 900), (2000, 1), (0, 64), (31, 257)]


def decode_mix(batch: int, max_ctx: int, gen: torch.Generator) -> list[tuple[int, int]]:
    lens = torch.randint(1, max_ctx + 1, (batch,), generator=gen).tolist()
    return [(n - 1, 1) for n in lens]


def make_batch(reqs: list[tuple[int, int]], num_slots: int, device: str = "cuda") -> ForwardBatch:
    """Requests on random, scattered slots of a pool of `num_slots`."""
    need = sum(p + e for p, e in reqs)
    assert need <= num_slots, (need, num_slots)
    perm = torch.randperm(num_slots)[:need]
    slots, start = [], 0
    for p, e in reqs:
        slots.append(perm[start : start + p + e])
        start += p + e
    ids = torch.zeros(sum(e for _, e in reqs), dtype=torch.int64)
    return ForwardBatch.build(ids, [e for _, e in reqs], [p for p, _ in reqs], slots, device=device)


def make_pool(shape: Shape, num_slots: int, layers: int, dtype: torch.dtype = DTYPE) -> KVPool:
    cfg = KVPoolConfig(layers, shape.num_kv_heads, shape.head_dim, dtype=dtype, device="cuda")
    pool = KVPool(cfg, num_slots)
    for layer in range(layers):
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    return pool


def make_backend(kind: str, pool: KVPool, shape: Shape) -> AttentionBackend:
    args = (pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.head_dim**-0.5)
    if kind == "torch":
        return TorchAttention(*args)
    if kind == "triton":
        from radixserve.runtime.attention.triton_backend import TritonAttention

        return TritonAttention(*args)
    from radixserve.runtime.attention.flashinfer_backend import flashinfer_attention

    # "flashinfer" picks tensor cores by group size (>= 4: both shapes here);
    # "flashinfer-cc" forces the CUDA-core decode kernel, to compare.
    return flashinfer_attention(*args, decode_tensor_cores=False if kind == "flashinfer-cc" else None)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


# --- 1. FlashInfer JIT builds ---------------------------------------------------------


def prewarm_flashinfer() -> dict[str, Any]:
    """Build (or load) each FlashInfer configuration's modules through the engine's own start-up
    path (`AttentionBackend.kernel_builds`, runtime/warm_up.py), in parallel threads, so every
    module is built before anything is timed and before the GPU tests' engines start."""
    jobs = [(LLAMA_8B, "flashinfer"), (QWEN_05B, "flashinfer"), (LLAMA_8B, "flashinfer-cc")]

    def one(job: tuple[Shape, str]) -> float:
        shape, kind = job
        t0 = time.perf_counter()
        pool = make_pool(shape, 256, 1)
        for build in make_backend(kind, pool, shape).kernel_builds(cascade=True):
            build.run()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as ex:
        times = list(ex.map(one, jobs))
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "per_config_s": {f"{s.name}/{k}": round(t, 1) for (s, k), t in zip(jobs, times, strict=True)},
    }


# --- 2. correctness -------------------------------------------------------------------------


def check(shape: Shape, kind: str, reqs: list[tuple[int, int]], layers: int = 2) -> float:
    """Worst relative error over `layers` layers of `kind` against the float32
    torch reference, with fresh q/k/v per layer; -1 where `kind` wrote K/V
    into the wrong slots."""
    num_slots = sum(p + e for p, e in reqs) + 4096
    pool = make_pool(shape, num_slots, layers)
    ref_cfg = KVPoolConfig(layers, shape.num_kv_heads, shape.head_dim, dtype=torch.float32, device="cuda")
    ref_pool = KVPool(ref_cfg, num_slots)
    for layer in range(layers):
        ref_pool.k[layer].copy_(pool.k[layer])
        ref_pool.v[layer].copy_(pool.v[layer])
    batch = make_batch(reqs, num_slots)
    backend = make_backend(kind, pool, shape)
    ref = make_backend("torch", ref_pool, shape)
    backend.plan(batch)
    ref.plan(batch)
    worst = 0.0
    t = batch.num_tokens
    for layer in range(layers):
        q = torch.randn(t, shape.num_heads, shape.head_dim, device="cuda", dtype=DTYPE)
        k = torch.randn(t, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=DTYPE)
        v = torch.randn(t, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=DTYPE)
        out = backend.forward(q, k, v, layer, batch)
        expect = ref.forward(q.float(), k.float(), v.float(), layer, batch)
        written = torch.equal(pool.k[layer].float(), ref_pool.k[layer]) and torch.equal(
            pool.v[layer].float(), ref_pool.v[layer]
        )
        if not written:
            return -1.0
        worst = max(worst, rel_err(out, expect))
    return worst


# --- 3. timings -------------------------------------------------------------------------------


def median_layer_ms(backend: AttentionBackend, batch: ForwardBatch, shape: Shape, layers: int) -> float:
    """Median ms of one layer's forward (K/V write + attention) of a planned batch, rotating layers."""
    from triton.testing import do_bench

    t = batch.num_tokens
    q = torch.randn(t, shape.num_heads, shape.head_dim, device="cuda", dtype=DTYPE)
    k = torch.randn(t, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=DTYPE)
    v = torch.randn(t, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=DTYPE)
    step = [0]

    def fn() -> None:
        backend.forward(q, k, v, step[0] % layers, batch)
        step[0] += 1

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def bench(shape: Shape, kind: str, reqs: list[tuple[int, int]], layers: int = 4) -> float:
    num_slots = sum(p + e for p, e in reqs) + 64
    pool = make_pool(shape, num_slots, layers)
    batch = make_batch(reqs, num_slots)
    backend = make_backend(kind, pool, shape)
    backend.plan(batch)
    return median_layer_ms(backend, batch, shape, layers)


def kv_bytes(shape: Shape, reqs: list[tuple[int, int]]) -> int:
    return sum(p + e for p, e in reqs) * shape.num_kv_heads * shape.head_dim * 2 * 2


def attn_flops(shape: Shape, reqs: list[tuple[int, int]]) -> int:
    # QK^T and PV, causal: new token i of a request with prefix p sees p + i + 1 keys.
    pairs = sum(e * p + e * (e + 1) // 2 for p, e in reqs)
    return 4 * shape.num_heads * shape.head_dim * pairs


# --- 4. packing the compiled modules ---------------------------------------------------------


def pack_flashinfer_cache(out_dir: Path) -> dict[str, Any]:
    """Every compiled FlashInfer module (.so), as `aot/<name>/<name>.so`."""
    try:
        import flashinfer
    except ImportError:
        return {"skipped": "flashinfer not installed"}
    found: dict[str, Path] = {}
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    aot = Path(flashinfer.__file__).parent / "data" / "aot"
    for root in (aot, base):
        for so in root.glob("**/*.so"):
            if so.stem == so.parent.name:  # <name>/<name>.so: a module, not a stray object
                found.setdefault(so.stem, so)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, so in sorted(found.items()):
            tar.add(so, arcname=f"aot/{name}/{name}.so")
    data = buf.getvalue()
    parts = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
    names = ["fi_cache.tgz"] if len(parts) == 1 else [f"fi_cache.tgz.{i:02d}" for i in range(len(parts))]
    for name, part in zip(names, parts, strict=True):
        (out_dir / name).write_bytes(part)
    return {"modules": sorted(found), "bytes": len(data), "files": names}


# --- driver -----------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    info = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "flashinfer"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # report, don't fail: the table says what ran
            info[mod] = f"unavailable ({type(e).__name__})"
    info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    prov = provenance()  # git HEAD + dirty; on a copy without .git, RADIXSERVE_COMMIT, marked so
    info["commit"] = commit_label(prov) or "unknown"
    info["commit_source"] = prov["commit_source"]
    info["source_sha256"] = prov["source_sha256"]
    return info


def guarded(results: dict[str, Any], key: str, fn: Any, *args: Any) -> Any:
    try:
        value = fn(*args)
    except Exception as e:
        traceback.print_exc()
        value = f"error: {type(e).__name__}: {e}"[:300]
    results[key] = value
    print(f"{key}: {value}", flush=True)
    return value


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    assert torch.cuda.is_available(), "needs a CUDA device"
    report: dict[str, Any] = {"workload": "attention_check", "dtype": "bfloat16", "versions": versions()}
    print(report["versions"], flush=True)
    have_fi = not report["versions"]["flashinfer"].startswith("unavailable")
    kinds = ["triton"] + (["flashinfer"] if have_fi else [])
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    try:
        if have_fi:
            guarded(report, "flashinfer_build", prewarm_flashinfer)

        errors: dict[str, Any] = {}
        for shape in (LLAMA_8B, QWEN_05B):
            for batch_name, reqs in (("mixed", MIXED), ("decode", decode_mix(48, 3000, gen))):
                extra = ["flashinfer-cc"] if have_fi and shape is LLAMA_8B and batch_name == "decode" else []
                for kind in kinds + extra:
                    guarded(errors, f"{shape.name}/{batch_name}/{kind}", check, shape, kind, reqs)
        report["rel_err"] = errors

        timings: dict[str, Any] = {}
        decode_reqs = [(1023, 1)] * 64
        extend_reqs = [(1024, 1024)] * 4
        for shape in (LLAMA_8B, QWEN_05B):
            for kind in ["torch", *kinds] + (["flashinfer-cc"] if have_fi and shape is LLAMA_8B else []):
                guarded(timings, f"{shape.name}/decode_b64_ctx1024/{kind}", bench, shape, kind, decode_reqs)
            for kind in ["torch", *kinds]:
                key = f"{shape.name}/extend_4x1024_on_1024/{kind}"
                guarded(timings, key, bench, shape, kind, extend_reqs)
        report["median_ms"] = timings
        derived: dict[str, float] = {}
        for key, ms in timings.items():
            if not isinstance(ms, float):
                continue
            shape = LLAMA_8B if key.startswith(LLAMA_8B.name) else QWEN_05B
            if "/decode_" in key:
                derived[key + " KV TB/s"] = kv_bytes(shape, decode_reqs) / (ms * 1e-3) / 1e12
            else:
                derived[key + " TFLOP/s"] = attn_flops(shape, extend_reqs) / (ms * 1e-3) / 1e12
        report["derived"] = derived
    finally:
        report["fi_cache"] = pack_flashinfer_cache(OUT) if have_fi else {"skipped": "no flashinfer"}
        (OUT / "attention_check.json").write_text(json.dumps(report, indent=2))
        print_table(report)


def print_table(report: dict[str, Any]) -> None:
    print("\n=== attention check:", json.dumps(report["versions"]))
    if "flashinfer_build" in report:
        print("flashinfer build/load:", report["flashinfer_build"])
    print_error_rows("correctness (bf16 vs fp32 torch)", list(report.get("rel_err", {}).items()), BF16_TOL)
    print(f"\n{'timing (one layer: K/V write + attention)':<56} {'median ms':>10} {'rate':>14}")
    derived = report.get("derived", {})
    for key, ms in report.get("median_ms", {}).items():
        rates = [f"{v:.2f} {k.rsplit(' ', 1)[1]}" for k, v in derived.items() if k.startswith(key + " ")]
        rate = rates[0] if rates else ""
        shown = f"{ms:.4f}" if isinstance(ms, float) else str(ms)[:40]
        print(f"{key:<56} {shown:>10} {rate:>14}")
    print("\nfi_cache:", json.dumps(report.get("fi_cache"))[:400])
    print("bound: decode reads its KV once; H200 copy ceiling ~4.3 TB/s, bf16 matmul ~790 TFLOP/s")


if __name__ == "__main__":
    main()
