"""The GPU suite: correctness against transformers, then W1-W4, in one run.

Run on the GPU machine from the repository root (see ../shared/GPU.md):

    source scripts/gpu_env.sh && PYTHONUNBUFFERED=1 RADIXSERVE_COMMIT=<sha> \
        python3 benchmarks/gpu_suite.py --out "$OUT"

Prints a table last and writes one JSON object per figure to
`<out>/h200.jsonl` (the schema of benchmarks/results/h200.jsonl). `--quick`
shrinks every workload for a shakedown. Workloads are those of
../shared/BENCHMARKS.md; the transformers peer runs in the same process on
the same weights.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import w1_requests, w2_requests  # noqa: E402
from radixserve import AsyncEngine, EngineConfig, SamplingParams  # noqa: E402
from radixserve.model.loader import LoadedModel, load_model  # noqa: E402
from radixserve.model.weights import checkpoint_views  # noqa: E402

BOUNDS = {("W1", "llama-3.1-8b"): 13600.0, ("W1", "qwen2.5-0.5b"): 187000.0}
TARGETS = {("W1", "llama-3.1-8b"): 11500.0, ("W1", "qwen2.5-0.5b"): 100000.0}

RECORDS: list[dict[str, Any]] = []
OUT_FILE: Path | None = None
ROWS: list[tuple[str, str, str, str, str]] = []


def record(workload: str, model: str, setting: str, metric: str, value: float, **extra: Any) -> None:
    rec = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": os.environ.get("RADIXSERVE_COMMIT", "unknown"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "workload": workload,
        "model": model,
        "setting": setting,
        "metric": metric,
        "value": round(float(value), 4),
    }
    rec.update({k: v for k, v in extra.items() if v is not None})
    RECORDS.append(rec)
    if OUT_FILE is not None:  # written as we go: a run cut short keeps what it measured
        with open(OUT_FILE, "a") as f:
            f.write(json.dumps(rec) + "\n")
    note = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
    ROWS.append((workload, model, setting, metric, f"{value:,.4g} {note}".strip()))
    print(f"[{workload}] {model} {setting} {metric} = {value:,.4g} {note}", flush=True)


def free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def engine_config(model: str, **kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(model=model, device="cuda", dtype="bfloat16")
    if not model.startswith("/"):
        base["model"] = f"dummy:{model}"
    base.update(kw)
    return EngineConfig(**base)


@contextmanager
def running_engine(cfg: EngineConfig) -> Iterator[tuple[AsyncEngine, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    engine = AsyncEngine(cfg)
    loop.run_until_complete(engine.start())
    try:
        yield engine, loop
    finally:
        loop.run_until_complete(engine.shutdown(drain=False))
        loop.close()
        del engine
        free_gpu()


# ---- the transformers twin --------------------------------------------------------------------


def hf_twin(loaded: LoadedModel) -> Any:
    """A transformers model holding exactly the weights of `loaded` (same dtype and device)."""
    from transformers import AutoModelForCausalLM

    cfg = loaded.hf_config
    dtype = next(loaded.model.parameters()).dtype
    with torch.device("cuda"):  # real init (buffers like rotary inv_freq), then our weights
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    missing, unexpected = hf.load_state_dict(checkpoint_views(loaded.model), strict=False)
    assert not unexpected, unexpected
    assert all("lm_head" in m for m in missing), missing  # tied: lm_head reads the embedding
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()


# ---- correctness -------------------------------------------------------------------------------


def correctness(model: str, backends: list[str], n_prompts: int, n_tokens: int) -> None:
    rng = random.Random(1)
    loaded = load_model(f"dummy:{model}" if not model.startswith("/") else model, torch.bfloat16, "cuda")
    vocab = loaded.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(16, 256))] for _ in range(n_prompts)]
    hf = hf_twin(loaded)
    del loaded
    free_gpu()
    params = SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True)
    ours: dict[str, list[list[int]]] = {}
    for backend in backends:
        cfg = engine_config(model, attention_backend=backend, cuda_graph=backend == "flashinfer")
        with running_engine(cfg) as (engine, loop):
            outs = loop.run_until_complete(engine.generate_many(prompts, params))
        ours[backend] = [list(o.token_ids) for o in outs]

    def predict(seqs: list[list[int]]) -> list[list[int]]:
        with torch.no_grad():
            return [
                hf(torch.tensor([p + s], device="cuda")).logits[0, len(p) - 1 : -1].argmax(-1).tolist()
                for p, s in zip(prompts, seqs)
            ]

    def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
        same = sum(x == y for sa, sb in zip(a, b) for x, y in zip(sa, sb))
        return same / sum(len(s) for s in a), sum(sa == sb for sa, sb in zip(a, b)) / len(a)

    name = model if not model.startswith("/") else "tiny-random-llama"
    bf16 = {b: predict(seqs) for b, seqs in ours.items()}
    hf.float()  # the float32 reference on the same weights: how noisy bf16 itself is here
    fp32 = {b: predict(seqs) for b, seqs in ours.items()}
    for backend, seqs in ours.items():
        top1, exact = agreement(seqs, bf16[backend])
        setting = f"backend={backend}"
        record("correctness", name, setting, "top1_agreement", top1, target=0.99)
        record("correctness", name, setting, "exact_sequences", exact)
        record("correctness", name, setting, "top1_agreement_vs_fp32", agreement(seqs, fp32[backend])[0])
        floor = agreement(bf16[backend], fp32[backend])[0]
        record("correctness", name, setting, "transformers_bf16_vs_fp32", floor)


def tiny_checkpoint(folder: Path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
    )  # head_dim 64: a FlashInfer build the suite needs anyway (qwen2.5-0.5b)
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return str(folder)


# ---- throughput -------------------------------------------------------------------------------


def run_offline(
    engine: AsyncEngine, loop: asyncio.AbstractEventLoop, reqs: list[tuple[list[int], int]]
) -> float:
    """Output tokens per second, first submit to last token."""

    async def go() -> int:
        outs = await asyncio.gather(
            *(
                engine.complete(ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                for ids, n in reqs
            )
        )
        return sum(len(o.token_ids) for o in outs)

    t0 = time.perf_counter()
    n = loop.run_until_complete(go())
    return n / (time.perf_counter() - t0)


def hf_generate_throughput(hf: Any, reqs: list[tuple[list[int], int]], batch: int) -> float:
    """transformers' padded `generate` in batches; counts only the tokens each request asked for."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    useful = 0
    for i in range(0, len(reqs), batch):
        chunk = reqs[i : i + batch]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long, device="cuda")
        mask = torch.zeros_like(ids)
        for r, (p, _) in enumerate(chunk):  # left padding
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        n_out = max(n for _, n in chunk)
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_out, min_new_tokens=n_out)
        useful += sum(n for _, n in chunk)
    torch.cuda.synchronize()
    return useful / (time.perf_counter() - t0)


PROFILE = False


@contextmanager
def worker_profile(engine: AsyncEngine) -> Iterator[None]:
    """cProfile the worker thread (where host time per step goes), printed after."""
    if not PROFILE:
        yield
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    engine._worker.submit("call", (lambda s: prof.enable(), lambda v, e: None))  # type: ignore[union-attr]
    yield
    engine._worker.submit("call", (lambda s: prof.disable(), lambda v, e: None))  # type: ignore[union-attr]
    time.sleep(0.2)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def w1(model: str, n: int, peer_n: int, quick: bool) -> float:
    vocab = load_vocab(model)
    reqs = w1_requests(n, 100, 1024, vocab) if not quick else w1_requests(n, 16, 128, vocab)
    with running_engine(engine_config(model)) as (engine, loop):
        run_offline(engine, loop, reqs[:8])  # warm-up: kernels, allocator
        loop.run_until_complete(engine.flush_cache())
        with worker_profile(engine):
            tps = run_offline(engine, loop, reqs)
        steps = engine._worker.steps  # type: ignore[union-attr]
        print(f"steps so far {steps}", flush=True)
    key = ("W1", model)
    record("W1", model, "radixserve", "output_tok_s", tps, bound=BOUNDS.get(key), target=TARGETS.get(key))
    loaded = load_model(f"dummy:{model}", torch.bfloat16, "cuda")
    hf = hf_twin(loaded)
    del loaded
    free_gpu()
    peer = hf_generate_throughput(hf, reqs[:peer_n], batch=peer_n)
    record("W1", model, "peer=transformers", "output_tok_s", peer, requests=peer_n)
    record(
        "W1", model, "radixserve/transformers", "ratio", tps / peer, target=15.0 if "8b" in model else None
    )
    del hf
    free_gpu()
    return tps


def load_vocab(model: str) -> int:
    from radixserve.model.shapes import shape_hf_config

    return int(shape_hf_config(model).vocab_size)


def w2(model: str, quick: bool) -> None:
    vocab = load_vocab(model)
    n, prefix, q, out = (64, 512, 32, 16) if quick else (512, 1024, 32, 32)
    reqs = w2_requests(prefix, n, q, out, vocab)
    results = {}
    for radix in (True, False):
        with running_engine(engine_config(model, enable_radix_cache=radix)) as (engine, loop):
            run_offline(engine, loop, [(r[0][-64:], 4) for r in reqs[:4]])  # warm-up, unrelated prefix
            loop.run_until_complete(engine.flush_cache())
            base = loop.run_until_complete(engine.stats())
            tps = run_offline(engine, loop, reqs)
            s = loop.run_until_complete(engine.stats())
        hit = (s["prompt_tokens_cached"] - base["prompt_tokens_cached"]) / (
            s["prompt_tokens"] - base["prompt_tokens"]
        )
        results[radix] = tps
        record("W2", model, f"radix={'on' if radix else 'off'}", "output_tok_s", tps)
        if radix:
            best = (n * prefix - prefix) / (n * (prefix + q))
            record("W2", model, "radix=on", "hit_rate", hit, bound=round(best, 5))
            record("W2", model, "radix=on", "hit_rate_of_best", hit / best, target=0.99)
    record("W2", model, "radix on/off", "ratio", results[True] / results[False], target=6.0)


def gpu_idle_fraction(engine: AsyncEngine, loop: asyncio.AbstractEventLoop, vocab: int, bs: int) -> float:
    """Share of wall time with no kernel running, over a window of pure decode steps."""
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(3)
    prompts = [[rng.randrange(vocab) for _ in range(256)] for _ in range(bs)]

    async def go() -> float:
        started = asyncio.Event()
        firsts = 0

        async def one(p: list[int]) -> None:
            nonlocal firsts
            async for out in engine.generate(
                p, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
            ):
                if len(out.token_ids) == 1:
                    firsts += 1
                    if firsts == bs:
                        started.set()

        tasks = [asyncio.create_task(one(p)) for p in prompts]
        await started.wait()
        await asyncio.sleep(0.2)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            await asyncio.sleep(0.5)
            torch.cuda.synchronize()
        await asyncio.gather(*tasks)
        spans = sorted(
            (e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
        )
        busy, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            busy += cur_e - cur_s
        window = spans[-1][1] - spans[0][0]
        return 1.0 - busy / window

    return loop.run_until_complete(go())


def w3(model: str, n: int, quick: bool) -> None:
    vocab = load_vocab(model)
    reqs = w1_requests(n, 100, 1024, vocab) if not quick else w1_requests(n, 16, 128, vocab)
    tps = {}
    for overlap in (True, False):
        with running_engine(engine_config(model, overlap=overlap)) as (engine, loop):
            run_offline(engine, loop, reqs[:8])
            loop.run_until_complete(engine.flush_cache())
            tps[overlap] = run_offline(engine, loop, reqs)
            idle = gpu_idle_fraction(engine, loop, vocab, 64 if quick else 128)
        setting = f"overlap={'on' if overlap else 'off'}"
        record("W3", model, setting, "output_tok_s", tps[overlap])
        record("W3", model, setting, "gpu_idle_frac", idle, target=0.02 if overlap else None)
    record("W3", model, "overlap on/off", "ratio", tps[True] / tps[False])


def w4(model: str, n: int, rate: float, quick: bool) -> None:
    vocab = load_vocab(model)
    reqs = w1_requests(n, 100, 1024, vocab) if not quick else w1_requests(n, 16, 128, vocab)
    rng = random.Random(4)
    ttft: list[float] = []
    tbt: list[float] = []

    async def one(ids: list[int], out_len: int, delay: float, engine: AsyncEngine) -> None:
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        last = None
        async for out in engine.generate(
            ids, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
        ):
            now = time.perf_counter()
            if last is None:
                ttft.append(now - t0)
            else:
                tbt.extend([(now - last) / max(1, len(out.delta_token_ids))] * len(out.delta_token_ids))
            last = now

    with running_engine(engine_config(model)) as (engine, loop):
        run_offline(engine, loop, reqs[:8])
        t, delays = 0.0, []
        for _ in reqs:
            t += rng.expovariate(rate)
            delays.append(t)

        async def all_requests() -> None:
            await asyncio.gather(*(one(i, o, d, engine) for (i, o), d in zip(reqs, delays)))

        loop.run_until_complete(all_requests())
    q = statistics.quantiles
    for name, xs in (("ttft", ttft), ("tbt", tbt)):
        record("W4", model, f"rate={rate:.1f}/s", f"{name}_p50_ms", 1000 * statistics.median(xs))
        record("W4", model, f"rate={rate:.1f}/s", f"{name}_p99_ms", 1000 * q(xs, n=100)[98])


def structured(quick: bool) -> None:
    """JSON-schema decoding at batch 64 against free decoding of as many tokens (bench_structured.py)."""
    from benchmarks.bench_structured import DEFAULT_SCHEMAS, gpu_throughput, load_schemas

    model = "smollm2-135m-instruct"  # a real tokenizer and weights: JSON that means something
    ns = argparse.Namespace(
        model=model, device="cuda", batch=64, max_tokens=64 if quick else 256, repeats=1 if quick else 3
    )
    fig = asyncio.run(gpu_throughput(ns, load_schemas(DEFAULT_SCHEMAS, None)))
    for name, tps in fig["tokens_per_s"].items():
        record("structured", model, f"batch=64 {name}", "output_tok_per_s", tps, tokens=fig["tokens"][name])
    record("structured", model, "batch=64", "json_vs_free", fig["json_vs_free"])
    record("structured", model, "batch=64", "json_jump_forward_vs_free", fig["json_jump_forward_vs_free"])


def section(name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - one failed section must not hide the others
        import traceback

        traceback.print_exc()
        ROWS.append((name, "-", "-", "FAILED", repr(e)[:120]))
    print(f"-- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    free_gpu()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma list of: correctness,w1,w2,w3,w4,structured")
    ap.add_argument("--profile", action="store_true", help="cProfile the worker during W1")
    args = ap.parse_args()
    global PROFILE, OUT_FILE
    PROFILE = args.profile
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    OUT_FILE = out / "h200.jsonl"
    OUT_FILE.write_text("")
    only = set(filter(None, args.only.split(",")))
    want = lambda s: not only or s in only  # noqa: E731
    q = args.quick
    t_all = time.perf_counter()
    if want("correctness"):
        tiny = tiny_checkpoint(Path("/tmp/radixserve_tiny"))
        section("correctness tiny", lambda: correctness(tiny, ["flashinfer", "triton", "torch"], 64, 32))
        section(
            "correctness qwen",
            lambda: correctness("qwen2.5-0.5b", ["flashinfer", "triton"], 64 if not q else 16, 32),
        )
        section(
            "correctness llama",
            lambda: correctness("llama-3.1-8b", ["flashinfer", "triton"], 64 if not q else 16, 32),
        )
    w1_tps: dict[str, float] = {}
    if want("w1"):
        section(
            "W1 qwen",
            lambda: w1_tps.update(qwen=w1("qwen2.5-0.5b", 256 if not q else 64, 64 if not q else 16, q)),
        )
        section(
            "W1 llama",
            lambda: w1_tps.update(llama=w1("llama-3.1-8b", 256 if not q else 64, 32 if not q else 8, q)),
        )
    if want("w2"):
        section("W2 llama", lambda: w2("llama-3.1-8b", q))
    if want("w3"):
        section("W3 qwen", lambda: w3("qwen2.5-0.5b", 256 if not q else 64, q))
    if want("w4"):
        # Near saturation: 90% of the W1 request rate (mean W1 output is 562 tokens).
        rate = 0.9 * w1_tps.get("llama", 5000.0) / (562 if not q else 72)
        section("W4 llama", lambda: w4("llama-3.1-8b", 256 if not q else 64, rate, q))
    if want("structured"):
        section("structured smollm2", lambda: structured(q))
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s; {len(RECORDS)} records -> {out / 'h200.jsonl'}\n")
    w = [max(len(r[i]) for r in ROWS) for i in range(5)] if ROWS else [0] * 5
    for r in ROWS:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


if __name__ == "__main__":
    main()
