"""Soak: thousands of mixed requests through one `AsyncEngine` under a KV pool small enough to
force eviction and retraction, with faults mixed in.

Request kinds (drawn at random): greedy (checked against transformers' greedy tokens),
greedy streams with a stop string (checked against the reference text), seeded sampling (same
seed and prompt, same tokens every time), n=2, cancellations (task cancel or leaving the
stream), cancel-then-reuse of a request id, abort by id, invalid parameters and invalid
prompts (which must raise ValueError/TypeError in the caller). At the end: the engine is
healthy and still serving, no KV slot leaked (`check_integrity()`, and after `flush_cache()`
every slot is free), resident memory bounded.

    python benchmarks/soak.py --requests 2000     # writes benchmarks/results/soak_cpu.json
tests/reliability/test_soak.py runs it at a reduced size (RADIXSERVE_SOAK_REQUESTS for more).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.model.embedded import embedded_model_dir

MODEL = "smollm2-135m-instruct"
GREEDY_TOKENS = 8
TEXTS = [
    "The history of the radix tree",
    "A short poem about the sea:",
    "Three facts about octopuses:",
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time, in a quiet village by the river, there lived an old clockmaker who",
    "List of prime numbers: 2, 3, 5, 7,",
    "In physics, entropy is a measure of",
]
BAD_PARAMS: list[dict[str, Any]] = [
    {"temperature": 10**400},
    {"top_p": 0.0},
    {"logit_bias": {5: float("inf")}},
    {"stop": 5},
    {"stop_token_ids": 5},
    {"repetition_penalty": float("nan")},
    {"n": 0},
    {"max_tokens": -1},
]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def references(tokenizer: Any) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, transformers' greedy tokens, their text) per prompt: what correct means."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32).eval()
    refs = []
    for text in TEXTS:
        ids = list(tokenizer.encode(text))
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=GREEDY_TOKENS, pad_token_id=2
            )
        toks = out[0, len(ids) :].tolist()
        assert len(toks) == GREEDY_TOKENS, "references need prompts that do not stop early"
        refs.append((ids, toks, tokenizer.decode(toks, skip_special_tokens=True)))
    return refs


class Soak:
    def __init__(self, eng: AsyncEngine, refs: list[Any], seed: int) -> None:
        self.eng, self.refs, self.rng = eng, refs, random.Random(seed)
        self.count: Counter[str] = Counter()
        self.seeds: dict[tuple[int, int], tuple[int, ...]] = {}
        self.failures: list[str] = []
        self.ids = [f"reuse-{i}" for i in range(4)]

    def check(self, ok: bool, what: str) -> None:
        self.count["outputs_checked"] += 1
        if not ok:
            self.failures.append(what)

    def fault(self, kind: str) -> None:
        self.count["faults_injected"] += 1
        self.count[f"fault_{kind}"] += 1

    async def greedy(self, request_id: str | None = None) -> None:
        ids, ref, _ = self.rng.choice(self.refs)
        p = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
        out = await self.eng.complete(ids, p, request_id=request_id)
        self.check(list(out.token_ids) == ref, f"greedy {ids[:4]}: {out.token_ids} != {ref}")

    async def stop_stream(self) -> None:
        ids, _, text = self.rng.choice(self.refs)
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        if not stop.strip():
            return await self.greedy()
        p = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True, stop=[stop])
        outs = [o async for o in self.eng.generate(ids, p)]
        want = text[: text.index(stop)]
        got = "".join(o.delta_text for o in outs)
        self.check(
            got == want == outs[-1].text and outs[-1].finish_reason == "stop", f"stop {stop!r}: {got!r}"
        )

    async def seeded(self) -> None:
        k = self.rng.randrange(2)
        seed = self.rng.randrange(3)
        ids = self.refs[k][0]
        out = await self.eng.complete(
            ids, SamplingParams(temperature=0.8, top_p=0.9, seed=seed, max_tokens=6)
        )
        first = self.seeds.setdefault((k, seed), out.token_ids)
        self.check(out.token_ids == first, f"seeded {k},{seed}: {out.token_ids} != {first}")

    async def n2(self) -> None:
        ids = self.rng.choice(self.refs)[0]
        outs = await self.eng.complete(ids, SamplingParams(temperature=1.0, n=2, max_tokens=5))
        ok = isinstance(outs, list) and [o.index for o in outs] == [0, 1] and all(o.finished for o in outs)
        self.check(ok, f"n=2: {outs}")

    async def cancel(self, reuse: bool) -> None:
        ids = self.rng.choice(self.refs)[0]
        rid = self.rng.choice(self.ids) if reuse else None
        p = SamplingParams(max_tokens=32, ignore_eos=True)
        try:
            if self.rng.random() < 0.5:
                task = asyncio.ensure_future(self.eng.complete(ids, p, request_id=rid))
                await asyncio.sleep(self.rng.random() * 0.2)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            else:
                leave_after = self.rng.randrange(3)
                async with contextlib.aclosing(self.eng.generate(ids, p, request_id=rid)) as stream:  # type: ignore[type-var]
                    async for out in stream:
                        if len(out.token_ids) > leave_after:
                            break
        except ValueError as e:  # the id is in use by a concurrent request: refused in the caller
            self.check("already running" in str(e), f"reuse: {e}")
            return
        self.fault("cancel")
        if reuse:  # at once, the same id again: must get its own output, not the cancelled one's
            self.fault("reused_id")
            with contextlib.suppress(ValueError):  # another task may have taken the id meanwhile
                await self.greedy(request_id=rid)

    async def abort_by_id(self) -> None:
        rid = f"abort-{self.rng.randrange(10**9)}"
        ids = self.rng.choice(self.refs)[0]
        outs = []
        async for out in self.eng.generate(
            ids, SamplingParams(max_tokens=64, ignore_eos=True), request_id=rid
        ):
            outs.append(out)
            if len(outs) == 1:
                await self.eng.abort(rid)
        self.fault("abort")
        self.check(outs[-1].finish_reason in ("abort", "length") and outs[-1].request_id == rid, "abort")

    async def invalid(self) -> None:
        self.fault("invalid")
        if self.rng.random() < 0.5:
            try:
                SamplingParams(**self.rng.choice(BAD_PARAMS))
            except ValueError:
                return self.check(True, "")
            return self.check(False, "bad params accepted")
        prompt = self.rng.choice(
            [[10**9], [], [1] * 10_000, [{"content": "no role"}], b"bytes", None, "\ud800", [-1]]
        )
        try:
            await self.eng.complete(prompt, SamplingParams(max_tokens=2))  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return self.check(True, "")
        self.check(False, f"bad prompt accepted: {prompt!r:.40}")

    async def one(self) -> None:
        r = self.rng.random()
        self.count["requests"] += 1
        if r < 0.35:
            await self.greedy()
        elif r < 0.45:
            await self.stop_stream()
        elif r < 0.55:
            await self.seeded()
        elif r < 0.63:
            await self.n2()
        elif r < 0.75:
            await self.cancel(reuse=False)
        elif r < 0.82:
            await self.cancel(reuse=True)
        elif r < 0.87:
            await self.abort_by_id()
        else:
            await self.invalid()


async def run_soak(
    n: int, seed: int = 0, concurrency: int = 48, kv_cache_tokens: int = 128
) -> dict[str, Any]:
    cfg = EngineConfig(
        model=MODEL,
        device="cpu",
        dtype="float32",
        kv_cache_tokens=kv_cache_tokens,
        max_running_requests=32,
        chunked_prefill_size=128,
        decode_reserve_ratio=0.0,  # admit eagerly: decodes then run the pool dry and retract
    )
    t0 = time.perf_counter()
    async with AsyncEngine(cfg) as eng:
        soak = Soak(eng, references(eng.tokenizer), seed)
        sem = asyncio.Semaphore(concurrency)
        rss: list[int] = []

        async def guarded(i: int) -> None:
            async with sem:
                try:
                    await asyncio.wait_for(soak.one(), 300)  # a hang fails the run
                except Exception as e:  # noqa: BLE001 - counted: every request must end cleanly
                    soak.failures.append(f"request {i}: {type(e).__name__}: {e}")
            if i in (n // 4, n - 1):
                rss.append(rss_bytes())

        await asyncio.gather(*(guarded(i) for i in range(n)))
        stats = await eng.stats()
        await eng.check_integrity()
        await soak.greedy()  # still serving, and still right
        healthy = eng.healthy
        assert await eng.flush_cache()
        after = await eng.stats()
        await eng.check_integrity()
    c = soak.count
    return {
        "requests": c["requests"],
        "faults_injected": c["faults_injected"],
        "faults": {k[6:]: v for k, v in sorted(c.items()) if k.startswith("fault_")},
        "outputs_checked": c["outputs_checked"],
        "failures": soak.failures,
        "slots_leaked": after["total_slots"] - after["free_slots"],
        "kv_slots": after["total_slots"],
        "retractions": stats["retractions"],
        "healthy_at_end": healthy,
        "rss_growth_mb": (rss[-1] - rss[0]) / 2**20 if len(rss) == 2 else 0.0,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import environment, print_table, record, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak_cpu.json"))
    args = ap.parse_args()
    env = environment()
    fig = asyncio.run(run_soak(args.requests, args.seed))
    keys = ["requests", "faults_injected", "outputs_checked", "failures", "slots_leaked", "retractions"]
    print_table(
        [*keys, "rss growth MB", "wall s"],
        [[*(len(fig[k]) if k == "failures" else fig[k] for k in keys), fig["rss_growth_mb"], fig["wall_s"]]],
    )
    write_results(args.out, [record("soak", MODEL, "float32", "cpu", fig)], env)
    if fig["failures"] or fig["slots_leaked"] or not fig["healthy_at_end"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
