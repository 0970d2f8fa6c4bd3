"""Decode attention kernels on the GPU, side by side: which one should a decode step run?

    source scripts/gpu_env.sh && python3 benchmarks/gpu_decode_attention.py

For each model's head layout (qwen2.5-0.5b: 14 query / 2 KV heads of 64;
llama-3.1-8b: 32 / 8 of 128), batch size and context, one layer's decode
attention (no K/V write) is timed for:

- `fi-tc` / `fi-cc`: FlashInfer's decode wrapper on tensor cores / CUDA cores,
  page size 1 (the engine's layout), and `-p16` with 16-token pages (the
  CUDA-core kernel is compiled for GQA groups of 1, 2, 4, 8 only: not for qwen's 7);
- `triton s/bn/w`: our split-K GQA decode kernel (runtime/attention/
  triton_kernels.py) with s splits, bn keys per tile and w warps, swept.

Every kernel is captured in a CUDA graph, one call per layer over 8 layers
(so the KV does not sit in L2) and timed by replaying the graph: what a
decode step's graph pays, without Python's launch cost. Each variant is
first checked against the float32 torch reference. Prints a table (median
ms per call and the KV read rate it implies) and writes
$OUT/decode_attention.json; compiled FlashInfer modules go to
$OUT/fi_cache.tgz for scripts/gpu_env.sh.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import provenance  # noqa: E402
from benchmarks.gpu_attention_check import LLAMA_8B, QWEN_05B, Shape, pack_flashinfer_cache  # noqa: E402
from radixserve.runtime.attention import triton_kernels as tk  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
DTYPE = torch.bfloat16
LAYERS = 8
TRITON_CONFIGS = [(s, bn, 4) for s in (1, 2, 4, 8, 16) for bn in (64, 128)]
CASES = {QWEN_05B: [32, 128, 256], LLAMA_8B: [16, 64, 256]}
CONTEXTS = ("ctx1024", "w1", "ctx4232")  # 4232: W5's 4096 + 8 + 128 (not shared here)


def context_lengths(batch: int, kind: str, gen: torch.Generator) -> list[int]:
    if kind.startswith("ctx"):
        return [int(kind[3:])] * batch
    return torch.randint(200, 2049, (batch,), generator=gen).tolist()  # W1-like: in + out so far


class Layout:
    """A pool of LAYERS layers and a batch's page table over it (scattered pages)."""

    def __init__(self, shape: Shape, lens: list[int], page: int) -> None:
        pages = [-(-n // page) for n in lens]
        num_pages = sum(pages) + 8
        kv = (num_pages, page, shape.num_kv_heads, shape.head_dim)
        self.k = [torch.randn(kv, dtype=DTYPE, device="cuda") for _ in range(LAYERS)]
        self.v = [torch.randn(kv, dtype=DTYPE, device="cuda") for _ in range(LAYERS)]
        perm = torch.randperm(num_pages, device="cuda")[: sum(pages)].to(torch.int32)
        self.indices = perm
        self.indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
        self.last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, pages)], dtype=torch.int32)
        self.lens, self.page, self.shape = lens, page, shape
        self.q = torch.randn(len(lens), shape.num_heads, shape.head_dim, dtype=DTYPE, device="cuda")

    def token_slots(self, b: int) -> torch.Tensor:
        """Request b's token slots in a flat [pages * page] view, in position order."""
        pages = self.indices[self.indptr[b] : self.indptr[b + 1]].long()
        flat = (pages[:, None] * self.page + torch.arange(self.page, device="cuda")[None, :]).reshape(-1)
        return flat[: self.lens[b]]


def reference(lay: Layout, layer: int) -> torch.Tensor:
    s = lay.shape
    k = lay.k[layer].reshape(-1, s.num_kv_heads, s.head_dim)
    v = lay.v[layer].reshape(-1, s.num_kv_heads, s.head_dim)
    return decode_reference(lay.q, k, v, [lay.token_slots(b) for b in range(len(lay.lens))])


def decode_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: list[torch.Tensor]
) -> torch.Tensor:
    """Decode attention in float32: row b of q `[B, Hq, D]` over the K/V `[S, Hkv, D]` at
    `slots[b]` (its context's token slots) -> `[B, Hq, D]`."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for b, rows in enumerate(slots):
        kb = k[rows].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        vb = v[rows].float().repeat_interleave(group, dim=1)
        att = torch.einsum("hd,nhd->hn", q[b].float(), kb) * q.shape[-1] ** -0.5
        outs.append(torch.einsum("hn,nhd->hd", att.softmax(-1), vb))
    return torch.stack(outs)


def flashinfer_call(lay: Layout, tensor_cores: bool) -> Callable[[int], torch.Tensor]:
    import flashinfer

    s = lay.shape
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    b = len(lay.lens)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=torch.zeros(b + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.zeros(lay.indices.numel(), dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.zeros(b, dtype=torch.int32, device="cuda"),
    )
    w.plan(
        lay.indptr.pin_memory(),
        lay.indices,
        lay.last.pin_memory(),
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        lay.page,
        pos_encoding_mode="NONE",
        q_data_type=DTYPE,
        kv_data_type=DTYPE,
    )
    return lambda layer: w.run(lay.q, (lay.k[layer], lay.v[layer]))


def triton_call(lay: Layout, splits: int, block_n: int, warps: int) -> Callable[[int], torch.Tensor]:
    s = lay.shape
    slots = torch.cat([lay.token_slots(b) for b in range(len(lay.lens))]).to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(lay.lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    flat = [tk.token_rows(kv) for kv in zip(lay.k, lay.v, strict=True)]
    tiling = tk.DecodeTiling(splits, block_n, warps)
    return lambda layer: tk.decode_attention(lay.q, flat[layer], (indptr, slots), s.head_dim**-0.5, tiling)


def triton_dyn_call(lay: Layout) -> Callable[[int], torch.Tensor]:
    """What the engine runs: the tiling of `triton_decode.decode_tiling` for the batch size."""
    from radixserve.runtime.attention.triton_decode import decode_tiling

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t = decode_tiling(len(lay.lens), lay.shape.num_kv_heads, sms)
    return triton_call(lay, t.splits, t.block_n, t.num_warps)


def graph_ms(call: Callable[[int], torch.Tensor]) -> float:
    """Median ms per call of a graph holding one call per layer, replayed 20 times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for layer in range(LAYERS):
            call(layer)  # warm up: compile, autotune, lazy allocations
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for layer in range(LAYERS):
            call(layer)
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / LAYERS)
    return sorted(times)[len(times) // 2]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def variants(lay1: Layout, lay16: Layout) -> dict[str, Callable[[int], torch.Tensor]]:
    out: dict[str, Callable[[int], torch.Tensor]] = {}
    try:
        import flashinfer  # noqa: F401

        out |= {"fi-tc": flashinfer_call(lay1, True), "fi-tc-p16": flashinfer_call(lay16, True)}
        group = lay1.shape.num_heads // lay1.shape.num_kv_heads
        if group in (1, 2, 4, 8):  # the CUDA-core kernel's group sizes (7 crashes its plan)
            out |= {"fi-cc": flashinfer_call(lay1, False), "fi-cc-p16": flashinfer_call(lay16, False)}
    except ImportError:
        pass
    for s, bn, w in TRITON_CONFIGS:
        out[f"triton {s}/{bn}/{w}"] = triton_call(lay1, s, bn, w)
    out["triton-dyn"] = triton_dyn_call(lay1)
    return out


def run_case(shape: Shape, batch: int, ctx: str, gen: torch.Generator) -> list[dict[str, Any]]:
    lens = context_lengths(batch, ctx, gen)
    lay1, lay16 = Layout(shape, lens, 1), Layout(shape, lens, 16)
    refs = {id(lay1): reference(lay1, 0), id(lay16): reference(lay16, 0)}
    kv_bytes = sum(lens) * shape.num_kv_heads * shape.head_dim * 2 * 2
    rows = []
    for name, call in variants(lay1, lay16).items():
        row: dict[str, Any] = {"shape": shape.name, "batch": batch, "ctx": ctx, "kernel": name}
        lay = lay16 if name.endswith("p16") else lay1
        rows.append(measure(row, call, refs[id(lay)], kv_bytes))
    return rows


def measure(
    row: dict[str, Any], call: Callable[[int], torch.Tensor], ref: torch.Tensor, kv_bytes: int
) -> dict[str, Any]:
    """`row` with the call's error against `ref`, its graph time and the KV read rate (or the
    error it raised: reported, not raised, so the table says what failed); printed."""
    try:
        row["rel_err"] = rel_err(call(0), ref)
        row["ms"] = graph_ms(call)
        row["kv_tb_s"] = kv_bytes / (row["ms"] * 1e-3) / 1e12
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:200]
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    report: dict[str, Any] = {"workload": "decode_attention", "provenance": provenance(), "rows": []}
    try:
        for shape, batches in CASES.items():
            for batch in batches:
                for ctx in CONTEXTS:
                    report["rows"].extend(run_case(shape, batch, ctx, gen))
    finally:
        report["fi_cache"] = pack_flashinfer_cache(OUT)
        (OUT / "decode_attention.json").write_text(json.dumps(report, indent=2))
    print_summary(report["rows"])


def print_summary(rows: list[dict[str, Any]]) -> None:
    """Per case: FlashInfer's variants, the best Triton config, and the bound."""
    print(f"\n{'case':<34} {'kernel':<18} {'ms':>8} {'TB/s':>6} {'rel err':>8}")
    cases = sorted({(r["shape"], r["batch"], r["ctx"]) for r in rows}, key=str)
    for case in cases:
        mine = [r for r in rows if (r["shape"], r["batch"], r["ctx"]) == case and "ms" in r]
        tri = sorted((r for r in mine if r["kernel"].startswith("triton ")), key=lambda r: r["ms"])
        dyn = [r for r in mine if r["kernel"] == "triton-dyn"]
        for r in [r for r in mine if r["kernel"].startswith("fi")] + tri[:2] + dyn:
            label = f"{case[0]} b{case[1]} {case[2]}"
            print(f"{label:<34} {r['kernel']:<18} {r['ms']:>8.4f} {r['kv_tb_s']:>6.2f} {r['rel_err']:>8.1e}")
    print_failed(rows)


def print_failed(rows: list[dict[str, Any]]) -> None:
    failed = [r for r in rows if "error" in r]
    print(f"\n{len(failed)} variant(s) failed")
    for r in failed[:10]:
        print(f"  {r['shape']} b{r['batch']} {r['kernel']}: {r['error']}")


if __name__ == "__main__":
    main()
