"""Host work per decode step, with long contexts, before vs after (two source trees, one run).

Drives the scheduler the way the worker does, without a model: `schedule()`,
turning the batch into the runner's input, and `process()` of a fake result
(random tokens), for B requests of `--ctx` prompt tokens each. What the
runner then enqueues on the device is not host work on a GPU and is left out
of "host"; the column "dev_ops" is the time those ops (the decode batch built
from the slot table) take when run on the CPU, for reference. The sampler is
launch-side host work on a GPU (its Python and op launches), so "sample" runs
it for real on fake logits over a small vocabulary (`--vocab`, so that the
ops themselves cost little) and counts it in "host"; a quarter of the requests
are greedy, the rest sample with temperature and top-p, one in 16 with a seed.
Times are the thread's CPU time (`time.thread_time`, torch on one thread), not
wall time: on a machine shared with other jobs, time spent preempted is not
host work, and would swamp the comparison. Modes: `complete`; `stream`, whose
readers take every output as soon as it is posted (one output per token);
`late`, streams nobody reads before the end (backpressure: no output is built
while one is unread). Requests that
nobody streams are detokenized at their end, so the per-step "process" of
`complete` mode leaves that out; "process µs/token (whole run)" is all
output processing of the run, the finishing steps included, per token. Each source
tree runs in its own process (PYTHONPATH), so `--base /path/to/other/checkout`
compares a branch against it.

    python benchmarks/bench_host_step.py --base /work/main    # writes benchmarks/results/host_step_cpu.json
    python benchmarks/bench_host_step.py --quick --base DIR   # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, environment, print_table, record, write_results  # noqa: E402

clock = time.thread_time  # CPU time of this thread: host work, whatever else the machine runs


def params_of(i: int, max_tokens: int) -> Any:
    from radixserve.sampling_params import SamplingParams

    if i % 4 == 0:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    seed = i if i % 16 == 1 else None
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.8, top_p=0.95, seed=seed)


def child(bs_list: list[int], ctx: int, steps: int, mode: str, vocab: int) -> list[dict[str, Any]]:
    stream, late = mode != "complete", mode == "late"
    import torch
    from transformers import AutoTokenizer

    from radixserve.cache.allocator import SlotAllocator
    from radixserve.cache.radix_tree import RadixCache
    from radixserve.cache.req_table import ReqToSlotTable
    from radixserve.model.embedded import embedded_model_dir
    from radixserve.runtime.runner import StepResult
    from radixserve.runtime.sampler import Sampler
    from radixserve.sched.request import Request
    from radixserve.sched.scheduler import Scheduler, SchedulerConfig

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    # "Sampled" tokens come from real text, so incremental detokenization does realistic work.
    text_ids = tok.encode(
        " ".join(f"Step {i}: the radix tree shares every prefix it has seen." for i in range(64))
    )
    cpu = torch.device("cpu")
    torch.set_num_threads(1)  # host work is one thread; the sampler's small ops gain nothing from more
    chunk = SchedulerConfig().chunked_prefill_size
    rows = []
    for bs in bs_list:
        rng = random.Random(bs)
        warm = 4
        # Early arrivals decode while the others prefill: room for them to go on until all run.
        max_tokens = bs * ctx // chunk + warm + steps + 8
        ctx_len = ctx + max_tokens + 8
        alloc = SlotAllocator(bs * ctx_len)
        table = ReqToSlotTable(bs, ctx_len)
        sched = Scheduler(SchedulerConfig(max_running_requests=bs), alloc, RadixCache(alloc), table, tok)
        for i in range(bs):
            ids = [rng.randrange(1000, 40000) for _ in range(ctx)]
            p = params_of(i, max_tokens)
            sched.add(Request(f"r{i}", 0, ids, p, frozenset({2}), ctx_len, arrival=i, stream=stream))
        sampler = Sampler(vocab, bs, cpu)
        # Backpressure (a tree with it): a stream gets no output while its previous one is unread.
        unread = getattr(sched.sampling_rows, "unread", None)
        logits = torch.randn(bs, vocab, generator=torch.Generator().manual_seed(bs))
        keys = ("schedule", "build", "sample", "process", "dev_ops")
        timings: dict[str, list[float]] = {k: [] for k in keys}
        n_decode = 0
        process_total = 0.0  # every step's output processing, the finishing ones included
        k = 0
        while sched.has_work:
            t0 = clock()
            batch: Any = sched.schedule()
            t1 = clock()
            dev = 0.0
            last = torch.zeros(bs, dtype=torch.int64)
            if hasattr(batch, "step"):  # the scheduler built the StepInput; the runner builds the batch
                from radixserve.runtime.step_batch import build_forward_batch

                step = batch.step
                t2 = clock()
                build_forward_batch(step, table.device_table, last, cpu)
                if step.is_decode:  # on the GPU these are device ops
                    dev = clock() - t2
                else:
                    t2 = clock()
            else:  # a base tree from before one step form: Batch.to_step(), then the decode ops
                step = batch.to_step(cpu)
                t2 = clock()
                if step.decode is not None:
                    from radixserve.runtime.decode_inputs import build_decode_batch

                    build_decode_batch(step.decode, table.device_table, last, cpu)
                    dev = clock() - t2
            n = len(step.sampling)
            s0 = clock()
            if n:  # where each row's logits were computed keys its noise; the host's work is the same
                sampler(logits[:n], step.sampling, positions=torch.zeros(n, dtype=torch.int64))
            t_sample = clock() - s0
            k += 1
            fake = [text_ids[(k + j) % len(text_ids)] for j in range(n)]
            res = StepResult(next_ids=fake)
            t3 = clock()
            sched.process(batch, res)
            t4 = clock()
            if unread is not None and not late:  # every stream's reader took its output at once
                unread[:] = False
            process_total += t4 - t3
            decode = all(e == 1 for e in getattr(batch, "step", batch).extend_lens) and len(batch.reqs) == bs
            if decode:
                n_decode += 1
                if warm < n_decode <= warm + steps:
                    got = {"schedule": t1 - t0, "build": t2 - t1, "sample": t_sample, "process": t4 - t3}
                    for key, v in got.items():
                        timings[key].append(v)
                    timings["dev_ops"].append(dev)
        med = {key: 1e3 * statistics.median(v) for key, v in timings.items()}
        med["host"] = med["schedule"] + med["build"] + med["sample"] + med["process"]
        per_token = 1e6 * process_total / (bs * max_tokens)
        row = {
            "batch": bs,
            "ctx": ctx,
            "stream": stream,
            "mode": mode,
            **{f"{key}_ms": v for key, v in med.items()},
        }
        rows.append({**row, "process_us_per_token_whole_run": per_token})
    return rows


# complete(); streams whose readers take every output at once; streams read only at the end
# (the base tree, without backpressure, runs "late" as "stream": it has no notion of a reader).
MODES = ("complete", "stream", "late")


def run_tree(tree: Path, args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", "--ctx", str(args.ctx), "--steps", str(args.steps)]
    cmd += ["--vocab", str(args.vocab)]
    cmd += ["--bs", *map(str, args.bs), "--mode", mode]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return list(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="the source tree to compare against (e.g. a main checkout)")
    ap.add_argument("--bs", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=64, help="the sampler's vocabulary (fake logits)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mode", default="complete", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/host_step_cpu.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.bs, args.ctx, args.steps, args.mode, args.vocab)))
        return
    if args.quick:
        args.bs, args.ctx, args.steps = [4, 16], 128, 6
    env = environment()
    trees = [("this", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    results, table = [], []
    for mode in MODES:
        got = {name: run_tree(tree, args, mode) for name, tree in trees}
        for i, row in enumerate(got["this"]):
            base = got["base"][i] if "base" in got else None
            for name, r in (("base", base), ("this", row)):
                if r is None:
                    continue
                keys = ("schedule_ms", "build_ms", "sample_ms", "process_ms", "host_ms", "dev_ops_ms")
                cells = [r[k] for k in (*keys, "process_us_per_token_whole_run")]
                ratio = base["host_ms"] / r["host_ms"] if base is not None and name == "this" else None
                table.append([r["batch"], r["ctx"], mode, name, *cells, ratio])
                results.append(record("host_step", "none (fake result)", "-", "cpu", r, tree=name))
    heads = ["batch", "ctx", "mode", "tree", "schedule", "build", "sample", "process", "host", "dev_ops"]
    heads += ["process µs/token (whole run)", "host speedup"]
    print("host ms per decode step at full batch (median); output processing per token over the whole run")
    print_table(heads, table)
    trees_doc = {name: str(tree) for name, tree in trees}
    print(f"wrote {write_results(args.out, results, env, trees=trees_doc)}")


if __name__ == "__main__":
    main()
