"""Frontend-language programs after the SGLang paper's workloads, scaled for a CPU.

    python benchmarks/bench_lang.py [--quick] [--scale S] [--device auto] [--model NAME]

Workloads (synthetic text, greedy):
- mc5: 5-shot multiple choice, `select` over " A".." D" for a batch of questions
  (the paper's MMLU workload);
- tot: tree of thought, a trunk then fork(3) thoughts, each fork(2) checks, a final answer;
- json: JSON extraction with `gen(json_schema=...)` (skipped, with the reason printed,
  when the engine has no structured output);
- chat: multi-turn chat, 3 user turns per conversation after a shared system prompt.

Each workload runs three ways in one run, on two engines loaded side by side:
- program + cache: `run_batch` on an engine with the radix cache (the prefix
  prefilled once, select's choices scored over the cached prompt, fork trunks shared);
- program, no cache: the same `run_batch` on an engine with the radix cache off;
- one by one, no cache: the same calls, one program at a time (num_threads=1),
  on the cache-off engine: every call prefills its whole prompt.
Figures: seconds (best of --repeats, rounds interleaved), programs/s, prompt tokens
the engine computed (admitted minus cached), and whether the outputs are equal.
The model needs a tokenizer (programs are text): a real checkpoint, the embedded
model, or `dummy:smollm2-135m` (random weights with the embedded tokenizer).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import environment, print_table, record, write_results  # noqa: E402

import radixserve.lang as sgl  # noqa: E402
from radixserve import Engine  # noqa: E402

SUBJECTS = ["biology", "history", "physics", "geography", "economics", "chemistry", "music", "law"]


def mc_question(i: int) -> tuple[str, list[str], str]:
    subj = SUBJECTS[i % len(SUBJECTS)]
    opts = [f"the {subj} fact number {i * 4 + k}" for k in range(4)]
    return f"Which of the following is true about {subj} topic {i}?", opts, "ABCD"[i % 4]


def mc_block(i: int, with_answer: bool) -> str:
    q, opts, ans = mc_question(i)
    text = q + "\n" + "".join(f"{'ABCD'[k]}. {o}\n" for k, o in enumerate(opts)) + "Answer:"
    return text + (f" {ans}\n\n" if with_answer else "")


FEW_SHOT = "The following are multiple choice questions (with answers).\n\n" + "".join(
    mc_block(1000 + i, True) for i in range(5)
)


@sgl.function
def mc5(s: Any, question: str) -> None:
    s += FEW_SHOT + question
    s += sgl.select("answer", [" A", " B", " C", " D"])


TOT_PROMPT = (
    "You are solving a puzzle step by step. Think of several ideas, check each one, "
    "and then give the final answer in one short sentence.\n"
    "Rules: answers must be short; each idea is one line; each check says yes or no.\n\n"
)


@sgl.function
def tot(s: Any, question: str, tokens: int) -> None:
    s += TOT_PROMPT + "Puzzle: " + question + "\n"
    ideas = s.fork(3)
    ideas += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=tokens, stop="\n") + "\n"
    checks = [f.fork(2) for f in ideas]
    for group in checks:
        group += lambda j: f"Check {j + 1}:" + sgl.gen("check", max_tokens=tokens // 2, stop="\n")
    for group in checks:
        group.join()
    ideas.join()
    s += "Final answer:" + sgl.gen("final", max_tokens=tokens, stop="\n")


SCHEMA = (
    '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, '
    '"age": {"type": "integer", "minimum": 0, "maximum": 120}, "city": {"type": "string", "maxLength": 16}}, '
    '"required": ["name", "age", "city"], "additionalProperties": false}'
)
JSON_PROMPT = (
    "Extract the person described in the document as JSON with the fields name, age and city.\n"
    "Document: Maria Lopez, 34, moved to Valencia last spring to open a bakery.\n"
    'JSON: {"name": "Maria Lopez", "age": 34, "city": "Valencia"}\n'
)


@sgl.function
def extract(s: Any, doc: str, tokens: int) -> None:
    s += JSON_PROMPT + "Document: " + doc + "\nJSON: "
    s += sgl.gen("json", max_tokens=tokens, json_schema=SCHEMA)


CHAT_SYSTEM = (
    "You are a concise, friendly assistant for a travel agency. You answer in at most two "
    "sentences, you never invent prices, and you suggest one concrete next step."
)


@sgl.function
def chat(s: Any, turns: list[str], tokens: int) -> None:
    s += sgl.system(CHAT_SYSTEM)
    for i, t in enumerate(turns):
        s += sgl.user(t)
        s += sgl.assistant(sgl.gen(f"reply_{i}", max_tokens=tokens))


def workloads(scale: float, quick: bool) -> dict[str, tuple[sgl.SglFunction, list[dict[str, Any]]]]:
    def n(base: int) -> int:
        return max(2, round(base * scale * (0.25 if quick else 1.0)))

    tok = 4 if quick else 8
    cities = ["Lisbon", "Oslo", "Kyoto", "Lima", "Cairo", "Quebec", "Perth", "Turin"]
    return {
        "mc5": (mc5, [{"question": mc_block(i, False)} for i in range(n(8))]),
        "tot": (
            tot,
            [{"question": f"Arrange {i + 3} coins in a triangle.", "tokens": tok} for i in range(n(2))],
        ),
        "json": (
            extract,
            [
                {"doc": f"Person {i} is {20 + i} years old and lives in {cities[i % 8]}.", "tokens": 40}
                for i in range(n(4))
            ],
        ),
        "chat": (
            chat,
            [
                {
                    "turns": [f"I want to visit {c} in spring.", "What should I pack?", "Thanks!"],
                    "tokens": tok,
                }
                for c in (cities * 4)[: n(4)]
            ],
        ),
    }


def batch_runner(
    fn: Any, batch: list[dict[str, Any]], engine: Engine, threads: int
) -> Callable[[], list[Any]]:
    """run_batch of `fn` on `engine`; threads=1: one program at a time (0: the default)."""

    def run() -> list[Any]:
        kw: dict[str, Any] = {"num_threads": threads} if threads else {}
        return list(fn.run_batch(batch, backend=engine, temperature=0, **kw))

    return run


def outputs(states: list[Any]) -> list[str]:
    return [st.text() if st.error() is None else f"error: {st.error()!r}" for st in states]


def measure(engine: Engine, run: Callable[[], list[Any]]) -> tuple[float, int, int, list[str]]:
    engine.flush_cache()
    before = engine.stats()
    t0 = time.perf_counter()
    states = run()
    secs = time.perf_counter() - t0
    after = engine.stats()
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    return secs, prompt - cached, cached, outputs(states)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto")
    # "dummy" with a folder holding config and tokenizer files: random weights, the real tokenizer.
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--scale", type=float, default=1.0, help="batch sizes times this (e.g. 8 on a GPU)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny batches, one round (smoke test)")
    ap.add_argument("--only", default="", help="comma-separated workloads (mc5,tot,json,chat)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    env = environment()
    repeats = 1 if args.quick else args.repeats
    on = Engine(model=args.model, device=args.device, load_format=args.load_format)
    off = Engine(model=args.model, device=args.device, load_format=args.load_format, enable_radix_cache=False)
    device = str(on.engine.config.torch_device())
    dtype = str(on.engine.config.torch_dtype()).replace("torch.", "")
    out = args.out or f"benchmarks/results/lang_{'cuda' if device.startswith('cuda') else 'cpu'}.json"
    results: list[dict[str, Any]] = []
    rows = []
    try:
        wl = workloads(args.scale, args.quick)
        chosen = [w for w in wl if not args.only or w in args.only.split(",")]
        warm = mc5.run_batch(wl["mc5"][1][:2], backend=on, temperature=0)  # first-call costs out of the way
        mc5.run_batch(wl["mc5"][1][:2], backend=off, temperature=0)
        assert all(st.error() is None for st in warm)
        for name in chosen:
            fn, batch = wl[name]
            modes = {
                "program+cache": (on, batch_runner(fn, batch, on, 0)),
                "program,no-cache": (off, batch_runner(fn, batch, off, 0)),
                "one-by-one,no-cache": (off, batch_runner(fn, batch, off, 1)),
            }
            runs: dict[str, list[tuple[float, int, int, list[str]]]] = {m: [] for m in modes}
            for _ in range(repeats):
                for m, (eng, fn_run) in modes.items():
                    runs[m].append(measure(eng, fn_run))
            best = {m: min(r, key=lambda x: x[0]) for m, r in runs.items()}
            base = best["program+cache"]
            same = all(b[3] == base[3] for b in best.values())
            errors = sum(o.startswith("error:") for o in base[3])
            figs: dict[str, Any] = {"programs": len(batch), "same_outputs": same, "errors": errors}
            for m, (secs, computed, cached, _) in best.items():
                figs[m] = {
                    "seconds": secs,
                    "programs_per_s": len(batch) / secs,
                    "computed_prompt_tokens": computed,
                    "cached_prompt_tokens": cached,
                    "all_seconds": [r[0] for r in runs[m]],
                }
                rows.append(
                    [
                        name,
                        m,
                        len(batch),
                        secs,
                        len(batch) / secs,
                        computed,
                        cached,
                        base[0] and secs / base[0],
                    ]
                )
            figs["speedup_vs_no_cache"] = best["program,no-cache"][0] / base[0]
            figs["speedup_vs_one_by_one"] = best["one-by-one,no-cache"][0] / base[0]
            results.append(record(f"lang-{name}", args.model, dtype, device, figs))
    finally:
        on.close()
        off.close()
    print_table(
        [
            "workload",
            "mode",
            "programs",
            "seconds",
            "programs/s",
            "computed prompt tok",
            "cached tok",
            "x slower",
        ],
        rows,
    )
    for r in results:
        f = r["figures"]
        if "speedup_vs_no_cache" in f:
            print(
                f"{r['workload']}: program+cache is {f['speedup_vs_no_cache']:.2f}x the no-cache program and "
                f"{f['speedup_vs_one_by_one']:.2f}x one-by-one; same outputs: {f['same_outputs']}"
            )
    path = write_results(out, results, env, scale=args.scale, repeats=repeats, quick=args.quick)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
