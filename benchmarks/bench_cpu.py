"""radixserve on a small CPU: W1-cpu and W2 (scaled down), each a ratio measured in one run.

    python benchmarks/bench_cpu.py [--quick] [--out benchmarks/results/cpu.json]

Model: the embedded smollm2-135m-instruct, float32, CPU, torch's default
thread count, for every engine. Workloads from BENCHMARKS.md's definitions via
common.py (EOS ignored, greedy).

W1-cpu (16 requests, input and output lengths in [16, 128]):
- radixserve: every request submitted at once through `AsyncEngine`; wall
  clock from the first submit to the last token; overlap on and lockstep,
  with `--mixed-steps` (default: EngineConfig's), and overlap on with the
  other setting (mixed prefill+decode steps against prefill first; not
  with --quick, which CI runs).
- transformers `generate`, static batches with left padding: requests are
  sorted by output length (longest first, which wastes least) and cut into
  batches of B; a batch runs `min_new_tokens = max_new_tokens` = its longest
  output, and only each request's own output length is counted as produced.
  Wall clock for the whole set. The best B of the sweep is "HF best".
- transformers continuous batching (`continuous_batching_context_manager`,
  the engine under `generate_batch`), each request with its own
  `max_new_tokens`; if it fails the error is recorded instead.

W2 (scaled down, --w2-* flags): one engine with the radix cache on, one
with it off; throughput ratio, the hit rate from `stats()` and from
per-request usage against the best possible, and whether greedy outputs are
the same with the cache on and off (cache on is also run with the other
`mixed_steps` setting).

Every engine is warmed up with a small request before it is timed. Figures
are measured in interleaved rounds (every figure once per round, all engines
up at once), and each is the best of --repeats rounds (every run's seconds
are kept in the JSON), so that a load spike from other users of the machine
hits every engine alike. transformers runs on a worker thread, as the
engines' loops do: torch's 2-thread OpenMP ran small ops several times
slower on the main thread than on another thread while the cores were
shared.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    W2_FULL,
    Request,
    W2Shape,
    environment,
    load_average,
    print_table,
    record,
    w1_requests,
    w2_requests,
    write_results,
)

from radixserve import AsyncEngine, EngineConfig, SamplingParams  # noqa: E402
from radixserve.model.embedded import embedded_model_dir  # noqa: E402

MODEL = "smollm2-135m-instruct"
PAD_ID = 2
WARMUP: list[Request] = [([1, 2, 3, 4, 5, 6, 7, 8], 4), ([9, 10, 11, 12], 4)]


_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", flush=True)


def best(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run, with every run's seconds kept beside it."""
    top = dict(min(runs, key=lambda r: r["seconds"]))
    top["runs_seconds"] = [round(r["seconds"], 3) for r in runs]
    return top


def timed(seconds: float, output_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"seconds": seconds, "output_tokens": output_tokens, "tok_s": output_tokens / seconds, **extra}


# ---- radixserve -----------------------------------------------------------------------------


def engine_config(**kw: Any) -> EngineConfig:
    return EngineConfig(model=MODEL, device="cpu", dtype="float32", **kw)


def greedy(out_len: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)


async def submit_all(engine: AsyncEngine, reqs: Sequence[Request]) -> tuple[float, list[Any]]:
    """Submit every request at once; seconds from the first submit to the last token."""
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.complete(ids, greedy(n)) for ids, n in reqs))
    return time.perf_counter() - t0, list(outs)


async def measure(engine: AsyncEngine, reqs: Sequence[Request]) -> dict[str, Any]:
    """One timed run on an empty radix cache, with hit counts from stats() and from usage."""
    assert await engine.flush_cache()
    before = await engine.stats()
    seconds, outs = await submit_all(engine, reqs)
    after = await engine.stats()
    got = [len(o.token_ids) for o in outs]
    if got != [n for _, n in reqs]:
        raise RuntimeError(f"radixserve produced {got} tokens, asked {[n for _, n in reqs]}")
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    usage_prompt = sum(o.usage.prompt_tokens for o in outs)
    usage_cached = sum(o.usage.cached_tokens for o in outs)
    await engine.check_integrity()
    return timed(
        seconds,
        sum(got),
        hit_rate_stats=cached / prompt if prompt else 0.0,
        hit_rate_usage=usage_cached / usage_prompt,
        prompt_tokens=usage_prompt,
        cached_tokens=usage_cached,
        retractions=after["retractions"] - before["retractions"],
        token_ids=[list(o.token_ids) for o in outs],
    )


# ---- transformers ---------------------------------------------------------------------------


def load_hf() -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    return model.eval()


def hf_generate(model: Any, reqs: Sequence[Request], batch_size: int) -> dict[str, Any]:
    """Static batches with left padding, longest outputs first; only requested tokens are counted."""
    order = sorted(range(len(reqs)), key=lambda i: -reqs[i][1])
    tokens: list[list[int]] = [[] for _ in reqs]
    computed = 0
    t0 = time.perf_counter()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(reqs[i][0]) for i in idx)
        steps = max(reqs[i][1] for i in idx)
        ids = torch.full((len(idx), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            prompt = reqs[i][0]
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=steps,
                min_new_tokens=steps,
                pad_token_id=PAD_ID,
            )
        for row, i in enumerate(idx):
            tokens[i] = out[row, width : width + reqs[i][1]].tolist()
        computed += steps * len(idx)
    seconds = time.perf_counter() - t0
    return timed(seconds, sum(n for _, n in reqs), tokens_computed=computed, token_ids=tokens)


def hf_continuous(model: Any, reqs: Sequence[Request]) -> dict[str, Any]:
    """transformers' continuous batching (paged attention), each request with its own max_new_tokens."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = 32
    blocks = sum(math.ceil((len(ids) + n) / page) for ids, n in [*reqs, *WARMUP]) + len(reqs)
    cb = ContinuousBatchingConfig(page_size=page, num_blocks=blocks, use_cuda_graph=False)
    gen = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=PAD_ID)

    def drain(mgr: Any, rids: list[str]) -> dict[str, list[int]]:
        done: dict[str, list[int]] = {}
        while len(done) < len(rids):
            res = mgr.get_result(timeout=1)
            if res is None:
                if not mgr.is_running():
                    raise RuntimeError("the continuous-batching thread stopped")
                continue
            if res.error is not None:
                raise RuntimeError(f"request {res.request_id}: {res.error}")
            if res.is_finished():
                done[res.request_id] = list(res.generated_tokens)
        return done

    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=30, warmup=False
    ) as mgr:
        drain(mgr, [mgr.add_request(ids, max_new_tokens=n) for ids, n in WARMUP])
        t0 = time.perf_counter()
        rids = [mgr.add_request(ids, request_id=f"w{i}", max_new_tokens=n) for i, (ids, n) in enumerate(reqs)]
        done = drain(mgr, rids)
        seconds = time.perf_counter() - t0
    tokens = [done[r] for r in rids]
    got = [len(t) for t in tokens]
    if got != [n for _, n in reqs]:
        raise RuntimeError(f"generate_batch produced {got} tokens, asked {[n for _, n in reqs]}")
    return timed(seconds, sum(got), token_ids=tokens)


# ---- the run --------------------------------------------------------------------------------


def same_tokens(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> int:
    return sum(list(x) == list(y) for x, y in zip(a, b))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cpu.json"))
    p.add_argument("--quick", action="store_true", help="tiny sizes, one HF batch size: a smoke run")
    p.add_argument("--repeats", type=int, default=2, help="rounds of every figure (the best run is kept)")
    p.add_argument("--kv-tokens", type=int, default=16384, help="KV pool of each radixserve engine")
    p.add_argument("--w1-n", type=int, default=16)
    p.add_argument("--w1-lo", type=int, default=16)
    p.add_argument("--w1-hi", type=int, default=128)
    p.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[16, 8])  # 4 was always slower
    p.add_argument("--w2-prefix", type=int, default=256)
    p.add_argument("--w2-n", type=int, default=32)
    p.add_argument("--w2-q", type=int, default=16)
    p.add_argument("--w2-out", type=int, default=8)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--no-generate-batch", action="store_true", help="skip transformers' continuous batching")
    p.add_argument(
        "--mixed-steps",
        choices=["on", "off"],
        default="on" if EngineConfig.mixed_steps else "off",
        help="EngineConfig.mixed_steps of the main engines (the other setting is measured beside them)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.w1_n, args.w1_lo, args.w1_hi, args.hf_batch_sizes = 4, 8, 16, [4]
        args.w2_prefix, args.w2_n, args.w2_q, args.w2_out = 32, 4, 4, 2
        args.repeats = 1
    return args


Job = tuple[str, Callable[[], Awaitable[dict[str, Any]]]]


async def run_rounds(args: argparse.Namespace, hf: Any, w1: list[Request], w2: list[Request]) -> Any:
    """Every figure once per round, interleaved, for --repeats rounds; the best run of each is kept.

    All engines stay up (idle workers sleep), so a load spike from other users
    of the machine hits every engine alike. transformers runs on a thread of
    `asyncio.to_thread`, off the main thread like the engines' own loops.
    """
    mixed = args.mixed_steps == "on"
    other = f"mixed_{'off' if mixed else 'on'}"
    configs: dict[str, dict[str, Any]] = {
        "default": {"mixed_steps": mixed},
        "lockstep": {"overlap": False, "mixed_steps": mixed},
        "no_cache": {"enable_radix_cache": False, "mixed_steps": mixed},
    }
    if not args.quick:  # CI runs --quick: the comparison is for real runs
        configs[other] = {"mixed_steps": not mixed}
    engines: dict[str, AsyncEngine] = {}
    try:
        for name, kw in configs.items():
            log(f"radixserve engine {name} {kw}")
            engines[name] = await AsyncEngine(engine_config(kv_cache_tokens=args.kv_tokens, **kw)).start()
            await submit_all(engines[name], WARMUP)
        await asyncio.to_thread(hf_generate, hf, WARMUP, len(WARMUP))
        jobs: list[Job] = [
            ("w1_overlap", lambda: measure(engines["default"], w1)),
            *(
                (f"hf_generate_b{bs}", lambda bs=bs: asyncio.to_thread(hf_generate, hf, w1, bs))
                for bs in args.hf_batch_sizes
            ),
            ("w1_lockstep", lambda: measure(engines["lockstep"], w1)),
            ("w2_cache_on", lambda: measure(engines["default"], w2)),
            ("w2_cache_off", lambda: measure(engines["no_cache"], w2)),
        ]
        if other in engines:
            jobs.insert(-2, (f"w1_{other}", lambda: measure(engines[other], w1)))
            jobs.append((f"w2_cache_on_{other}", lambda: measure(engines[other], w2)))
        if not args.no_generate_batch:
            jobs.append(("hf_continuous_batching", lambda: asyncio.to_thread(hf_continuous, hf, w1)))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in jobs}
        errors: dict[str, str] = {}
        for r in range(args.repeats):
            for name, job in jobs:
                if name in errors:
                    continue
                log(f"round {r + 1}/{args.repeats}: {name}")
                try:
                    runs[name].append(await job())
                except Exception as e:  # noqa: BLE001 - a peer that fails is recorded, not fatal
                    if not name.startswith("hf_continuous"):
                        raise
                    errors[name] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
                gc.collect()
        return {name: best(rs) for name, rs in runs.items() if rs}, errors.get("hf_continuous_batching")
    finally:
        for engine in engines.values():
            await engine.shutdown()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.env = environment()  # commit and load when the code was imported and the run began
    log(f"torch threads: {torch.get_num_threads()}, commit {args.env['commit']}, load {load_average()}")
    hf = load_hf()
    vocab = hf.config.vocab_size
    w1 = w1_requests(args.w1_n, args.w1_lo, args.w1_hi, vocab)
    shape = W2Shape(args.w2_prefix, args.w2_n, args.w2_q, args.w2_out)
    w2 = w2_requests(shape.prefix_len, shape.n, shape.q_len, shape.out_len, vocab)
    figs, cb_error = asyncio.run(run_rounds(args, hf, w1, w2))
    rs = {k: v for k, v in figs.items() if not k.startswith("hf_")}
    peers = {k: v for k, v in figs.items() if k.startswith("hf_")}
    if args.no_generate_batch:
        cb_error = None
    return report(args, rs, peers, cb_error, shape)


def report(
    args: argparse.Namespace,
    rs: dict[str, dict[str, Any]],
    peers: dict[str, dict[str, Any]],
    cb_error: str | None,
    shape: W2Shape,
) -> dict[str, Any]:
    ov, ls, on, off = rs["w1_overlap"], rs["w1_lockstep"], rs["w2_cache_on"], rs["w2_cache_off"]
    mixed = args.mixed_steps == "on"
    other = f"mixed_{'off' if mixed else 'on'}"
    w1_other, w2_other = mixed_compare(rs, mixed, other)
    gen = {k: v for k, v in peers.items() if k.startswith("hf_generate_b")}
    best_gen = min(gen, key=lambda k: gen[k]["seconds"])
    ref = gen.get("hf_generate_b16", gen[best_gen])["token_ids"]
    w1_fig: dict[str, Any] = {
        "requests": args.w1_n,
        "lengths": [args.w1_lo, args.w1_hi],
        "output_tokens": ov["output_tokens"],
        "mixed_steps": mixed,  # of radixserve_overlap and radixserve_lockstep
        "radixserve_overlap": strip(ov),
        "radixserve_lockstep": strip(ls),
        **w1_other,
        **{k: strip(v) for k, v in peers.items()},
        "hf_generate_best": best_gen,
        "ratio_radixserve_vs_hf_generate_best": ov["tok_s"] / gen[best_gen]["tok_s"],
        "ratio_overlap_vs_lockstep": ov["tok_s"] / ls["tok_s"],
        "overlap_lockstep_same_tokens": ov["token_ids"] == ls["token_ids"],
        "requests_same_tokens_as_hf_generate": same_tokens(ov["token_ids"], ref),
    }
    if "hf_generate_b16" in gen:
        w1_fig["ratio_radixserve_vs_hf_generate_b16"] = ov["tok_s"] / gen["hf_generate_b16"]["tok_s"]
    if "hf_continuous_batching" in peers:
        cb = peers["hf_continuous_batching"]
        w1_fig["ratio_radixserve_vs_hf_continuous_batching"] = ov["tok_s"] / cb["tok_s"]
        w1_fig["requests_same_tokens_hf_continuous_batching"] = same_tokens(ov["token_ids"], cb["token_ids"])
    else:
        w1_fig["hf_continuous_batching_error"] = cb_error or "skipped (--no-generate-batch)"
    w2_fig: dict[str, Any] = {
        "shape": vars(shape),
        "scale_vs_w2": {
            "prefix": shape.prefix_len / W2_FULL.prefix_len,
            "requests": shape.n / W2_FULL.n,
            "question": shape.q_len / W2_FULL.q_len,
            "output": shape.out_len / W2_FULL.out_len,
        },
        "mixed_steps": mixed,  # of cache_on and cache_off
        "cache_on": strip(on),
        "cache_off": strip(off),
        **w2_other,
        "ratio_cache_on_vs_off": on["tok_s"] / off["tok_s"],
        "hit_rate_stats": on["hit_rate_stats"],
        "hit_rate_usage": on["hit_rate_usage"],
        "hit_rate_best": shape.best_hit_rate(),
        "hit_rate_vs_best": on["hit_rate_stats"] / shape.best_hit_rate(),
        "outputs_identical_cache_on_off": on["token_ids"] == off["token_ids"],
    }
    threads = torch.get_num_threads()
    results = [
        record("W1-cpu", MODEL, "float32", "cpu", w1_fig, torch_threads=threads),
        record("W2-cpu", MODEL, "float32", "cpu", w2_fig, torch_threads=threads),
    ]
    path = write_results(
        args.out,
        results,
        quick=args.quick,
        repeats=args.repeats,
        mixed_steps=mixed,
        torch_threads=threads,
        env=args.env,
        load_average_end=load_average(),
        seconds_total=time.perf_counter() - _T0,
    )
    print_summary(w1_fig, w2_fig, peers, cb_error)
    log(f"wrote {path}")
    return {"results": results, "path": str(path)}


def mixed_compare(
    rs: dict[str, dict[str, Any]], mixed: bool, other: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """W1's and W2's figures of the other `mixed_steps` setting, with the ratios
    (tok/s with mixed steps on over off); empty where it was not run (--quick)."""
    if f"w1_{other}" not in rs:
        return {}, {}
    ov, ov2, on, on2 = rs["w1_overlap"], rs[f"w1_{other}"], rs["w2_cache_on"], rs[f"w2_cache_on_{other}"]
    sign = 1 if mixed else -1
    w1 = {
        f"radixserve_overlap_{other}": strip(ov2),
        "ratio_mixed_on_vs_off": (ov["tok_s"] / ov2["tok_s"]) ** sign,
        "mixed_on_off_same_tokens": ov["token_ids"] == ov2["token_ids"],
    }
    w2 = {
        f"cache_on_{other}": strip(on2),
        "ratio_cache_on_mixed_on_vs_off": (on["tok_s"] / on2["tok_s"]) ** sign,
        "outputs_identical_mixed_on_off": on["token_ids"] == on2["token_ids"],
    }
    return w1, w2


def strip(fig: dict[str, Any]) -> dict[str, Any]:
    """A run's figures without its token ids (kept out of the JSON)."""
    return {k: v for k, v in fig.items() if k != "token_ids"}


def print_summary(
    w1: dict[str, Any], w2: dict[str, Any], peers: dict[str, dict[str, Any]], cb_error: str | None
) -> None:
    ov = w1["radixserve_overlap"]
    setting = "mixed on" if w1["mixed_steps"] else "mixed off"
    other = "mixed_off" if w1["mixed_steps"] else "mixed_on"
    ov2, on2 = w1.get(f"radixserve_overlap_{other}"), w2.get(f"cache_on_{other}")
    rows: list[list[Any]] = [
        ["W1-cpu", f"radixserve overlap, {setting}", ov["seconds"], ov["tok_s"], 1.0],
        ["W1-cpu", f"radixserve lockstep, {setting}", w1["radixserve_lockstep"]["seconds"],
         w1["radixserve_lockstep"]["tok_s"], 1 / w1["ratio_overlap_vs_lockstep"]],
    ]  # fmt: skip
    if ov2:
        rows.append(["W1-cpu", f"radixserve overlap, {other.replace('_', ' ')}", ov2["seconds"], ov2["tok_s"],
                     ov2["tok_s"] / ov["tok_s"]])  # fmt: skip
    for name, fig in peers.items():
        label = name.replace("hf_generate_b", "HF generate, batch ").replace(
            "hf_continuous_batching", "HF continuous batching"
        )
        rows.append(["W1-cpu", label, fig["seconds"], fig["tok_s"], fig["tok_s"] / ov["tok_s"]])
    if cb_error:
        rows.append(["W1-cpu", "HF continuous batching", None, None, f"failed: {cb_error[:60]}"])
    on, off = w2["cache_on"], w2["cache_off"]
    rows += [
        ["W2-cpu", f"radixserve cache on, {setting}", on["seconds"], on["tok_s"], 1.0],
        ["W2-cpu", f"radixserve cache off, {setting}", off["seconds"], off["tok_s"],
         1 / w2["ratio_cache_on_vs_off"]],
    ]  # fmt: skip
    if on2:
        label = f"radixserve cache on, {other.replace('_', ' ')}"
        rows.append(["W2-cpu", label, on2["seconds"], on2["tok_s"], on2["tok_s"] / on["tok_s"]])
    print()
    print_table(["workload", "engine", "seconds", "output tok/s", "x first row of workload"], rows)
    print()
    ratios = [
        ["W1 radixserve / HF generate best", f"{w1['ratio_radixserve_vs_hf_generate_best']:.2f}x"
         f" ({w1['hf_generate_best']})"],
        ["W1 radixserve / HF continuous batching",
         f"{w1['ratio_radixserve_vs_hf_continuous_batching']:.2f}x"
         if "ratio_radixserve_vs_hf_continuous_batching" in w1 else "n/a"],
        ["W1 overlap / lockstep", f"{w1['ratio_overlap_vs_lockstep']:.2f}x"],
        ["W1 overlap and lockstep same tokens", w1["overlap_lockstep_same_tokens"]],
        ["W1 requests with HF generate's tokens",
         f"{w1['requests_same_tokens_as_hf_generate']}/{w1['requests']}"],
        ["W2 cache on / off", f"{w2['ratio_cache_on_vs_off']:.2f}x"],
        ["W2 hit rate (stats / usage / best)",
         f"{w2['hit_rate_stats']:.4f} / {w2['hit_rate_usage']:.4f} / {w2['hit_rate_best']:.4f}"],
        ["W2 outputs identical cache on/off", w2["outputs_identical_cache_on_off"]],
    ]  # fmt: skip
    if ov2:
        ratios += [
            ["W1 mixed steps on / off", f"{w1['ratio_mixed_on_vs_off']:.2f}x"],
            ["W1 mixed on and off same tokens", w1["mixed_on_off_same_tokens"]],
            ["W2 cache on: mixed steps on / off", f"{w2['ratio_cache_on_mixed_on_vs_off']:.2f}x"],
            ["W2 outputs identical mixed on/off", w2["outputs_identical_mixed_on_off"]],
        ]
    if "ratio_radixserve_vs_hf_generate_b16" in w1:
        ratios.insert(1, ["W1 radixserve / HF generate batch 16",
                          f"{w1['ratio_radixserve_vs_hf_generate_b16']:.2f}x"])  # fmt: skip
    print_table(["ratio (one run)", "value"], ratios)


if __name__ == "__main__":
    main()
