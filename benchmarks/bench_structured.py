"""Structured output over JSONSchemaBench: compile rate, validity, mask cost, jump-forward.

    python benchmarks/bench_structured.py [SCHEMAS] [--limit N] [--out PATH]
    python benchmarks/bench_structured.py --only jump-forward   # the jump-forward A/B alone
    python benchmarks/bench_structured.py --gpu-throughput      # on a CUDA machine

SCHEMAS is a JSON-lines file of `{"id", "split", "schema"}` objects (default:
../shared/data/jsonschemabench/schemas.jsonl next to the repository, or
shared/data/... inside it).

CPU run (the embedded smollm2-135m-instruct, float32, overlap on):
- compile: every schema through the engine's compile path (canonicalization
  and xgrammar), the failures grouped by reason, compile time p50/p99;
- generate: for every schema that compiles, a chat-templated "answer with a
  JSON object for this schema" prompt, greedy and seeded (temperature 0.8),
  all submitted at once (a schema's two requests share the prompt's KV);
  every output the grammar finished ("stop") must
  parse and validate with `jsonschema` (its format keywords are annotations,
  as in the JSON Schema spec's default); outputs cut by max_tokens are
  counted apart. Mask-fill host time per constrained token from `stats()`.
- jump-forward: fixed-key schemas (an object whose properties are all
  required) one request at a time, greedy, jump-forward off and on: forward
  passes (`stats()["forward_steps"]`), wall time, validity. With
  `--only jump-forward` only this part runs (the compile step picks the
  schemas), with overlap on, with overlap as on CUDA (no hold, see
  SchedulerConfig.hold_for_jumps) and in lockstep for reference.

--gpu-throughput (CUDA): 64 JSON-schema requests at once against 64 free
requests generating the same number of tokens each (ignore_eos, max_tokens =
the JSON run's lengths), and the JSON run again with `jump_forward` left to the
device's default (on CUDA: the forced text before the first token and a forced
stop token only) and with it on; output tokens per second, interleaved rounds,
best of --repeats.

Writes JSON under benchmarks/results/ and prints tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, environment, print_table, record, write_results  # noqa: E402

_DATA = Path("shared") / "data" / "jsonschemabench" / "schemas.jsonl"
# ../shared next to the checkout; shared/ inside it where a machine carries it there.
DEFAULT_SCHEMAS = next((p for p in (ROOT.parent / _DATA, ROOT / _DATA) if p.exists()), ROOT.parent / _DATA)
PROMPT_SCHEMA_CHARS = 1500  # schema text shown in the prompt (the grammar enforces all of it)


def load_schemas(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def prompt_for(schema: Any) -> list[dict[str, str]]:
    text = json.dumps(schema)[:PROMPT_SCHEMA_CHARS]
    return [
        {"role": "system", "content": "You answer with a single JSON object and nothing else."},
        {"role": "user", "content": f"Answer with a JSON object for this JSON schema:\n{text}"},
    ]


def reason_of(err: str) -> str:
    """Group compile errors: drop quoted specifics and positions."""
    err = err.removeprefix("SamplingParams.json_schema: ").removeprefix("json_schema: ")
    err = re.sub(r'"[^"]*"|\'[^\']*\'', "…", err)
    err = re.sub(r"#/\S*|\d+", "…", err)
    return err[:100]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def validate(text: str, schema: Any) -> str | None:
    """None if `text` is an instance of `schema`, else why not."""
    import jsonschema

    try:
        inst = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    try:
        cls = jsonschema.validators.validator_for(schema)
        errs = sorted(cls(schema).iter_errors(inst), key=str)
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions._WrappedReferencingError) as e:
        return f"unverifiable: {type(e).__name__}: {str(e)[:80]}"
    except OverflowError as e:  # e.g. multipleOf against 1e400, which json.loads reads as inf
        return f"unverifiable: {type(e).__name__}: {str(e)[:80]}"
    return None if not errs else f"invalid: {errs[0].message[:120]}"


def fixed_keys(schema: Any) -> bool:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return bool(props) and set(schema.get("required", [])) >= set(props)


async def compile_all(engine: Any, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from radixserve import SamplingParams

    ok, failures = [], []
    for row in rows:
        try:
            sp = SamplingParams(json_schema=row["schema"])
            await engine._core.grammars.compile(sp)  # the engine's compiler, as a request's would
            ok.append(row)
        except ValueError as e:
            failures.append({"id": row["id"], "reason": reason_of(str(e)), "error": str(e)[:300]})
    times = engine.grammar_cache.compile_times if engine.grammar_cache else []
    by_reason = Counter(f["reason"] for f in failures)
    figures = {
        "schemas": len(rows),
        "compiled": len(ok),
        "compile_rate": len(ok) / max(1, len(rows)),
        "compile_s_p50": pct(times, 0.5),
        "compile_s_p99": pct(times, 0.99),
        "compile_s_max": max(times) if times else None,
        "failures_by_reason": dict(by_reason.most_common()),
        "failures": failures,
    }
    return ok, figures


async def generate_all(engine: Any, rows: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """Greedy and seeded requests for every schema, all submitted at once.

    The two requests of a schema share their prompt, so the second one hits
    the radix cache instead of prefilling it again (most of a CPU run)."""
    from radixserve import SamplingParams

    modes = ("greedy", "seeded")
    params = [
        SamplingParams(
            json_schema=r["schema"],
            max_tokens=max_tokens,
            temperature=0.0 if mode == "greedy" else 0.8,
            seed=None if mode == "greedy" else i,
        )
        for i, r in enumerate(rows)
        for mode in modes
    ]
    prompts = [prompt_for(r["schema"]) for r in rows for _ in modes]
    s0 = await engine.stats()
    t0 = time.perf_counter()
    outs = await engine.generate_many(prompts, params)
    wall = time.perf_counter() - t0
    s1 = await engine.stats()
    runs: dict[str, Any] = {
        "wall_s": wall,
        "mask_fill_us_per_token": 1e6
        * (s1["mask_fill_s"] - s0["mask_fill_s"])
        / max(1, s1["mask_rows"] - s0["mask_rows"]),
        "jump_forward_tokens": s1["jump_forward_tokens"] - s0["jump_forward_tokens"],
    }
    for k, mode in enumerate(modes):
        finished = valid = 0
        bad: list[dict[str, Any]] = []
        unverifiable: list[str] = []
        reasons: Counter[str] = Counter()
        mode_outs = outs[k :: len(modes)]
        for r, out in zip(rows, mode_outs):
            reasons[str(out.finish_reason)] += 1
            if out.finish_reason != "stop":
                continue
            finished += 1
            why = validate(out.text, r["schema"])
            if why is None:
                valid += 1
            elif why.startswith("unverifiable"):
                unverifiable.append(r["id"])
            else:
                bad.append({"id": r["id"], "why": why, "text": out.text[:300]})
        runs[mode] = {
            "requests": len(rows),
            "finish_reasons": dict(reasons),
            "grammar_finished": finished,
            "valid": valid,
            "valid_rate_of_finished": valid / max(1, finished - len(unverifiable)),
            "unverifiable": unverifiable,
            "invalid": bad,
            "output_tokens": sum(len(o.token_ids) for o in mode_outs),
        }
    return runs


async def jump_forward_ab(engine: Any, rows: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """Off and on interleaved per schema, so that load from other users of the machine hits both."""
    from radixserve import SamplingParams

    res: dict[str, Any] = {
        k: {
            "requests": len(rows),
            "forward_passes": 0,
            "output_tokens": 0,
            "wall_s": 0.0,
            "grammar_finished": 0,
            "valid": 0,
            "same_text": 0,
        }
        for k in ("off", "on")
    }
    for r in rows:
        texts = {}
        for jf in (False, True):
            sp = SamplingParams(
                json_schema=r["schema"], max_tokens=max_tokens, temperature=0.0, jump_forward=jf
            )
            s0 = await engine.stats()
            t0 = time.perf_counter()
            out = await engine.complete(prompt_for(r["schema"]), sp)
            d = res["on" if jf else "off"]
            d["wall_s"] += time.perf_counter() - t0
            s1 = await engine.stats()
            d["forward_passes"] += s1["forward_steps"] - s0["forward_steps"]
            d["output_tokens"] += len(out.token_ids)
            texts[jf] = out.text
            if out.finish_reason == "stop":
                d["grammar_finished"] += 1
                d["valid"] += validate(out.text, r["schema"]) is None
        res["on"]["same_text"] += texts[False] == texts[True]
    res["forward_pass_ratio_off_over_on"] = res["off"]["forward_passes"] / max(1, res["on"]["forward_passes"])
    res["wall_ratio_off_over_on"] = res["off"]["wall_s"] / max(1e-9, res["on"]["wall_s"])
    return res


async def gpu_throughput(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from radixserve import AsyncEngine, EngineConfig, SamplingParams

    async with AsyncEngine(
        EngineConfig(model=args.model, device=args.device, load_format=args.load_format)
    ) as engine:
        ok, _ = await compile_all(engine, rows)
        batch = [ok[i % len(ok)] for i in range(args.batch)]
        prompts = [prompt_for(r["schema"]) for r in batch]
        warm = SamplingParams(max_tokens=8, temperature=0.0)
        await engine.generate_many(prompts[:4], warm)

        def json_params(jf: bool | None) -> list[SamplingParams]:
            return [
                SamplingParams(
                    json_schema=r["schema"], max_tokens=args.max_tokens, temperature=0.0, jump_forward=jf
                )
                for r in batch
            ]

        lengths = [len(o.token_ids) for o in await engine.generate_many(prompts, json_params(False))]
        free = [SamplingParams(max_tokens=max(1, n), temperature=0.0, ignore_eos=True) for n in lengths]
        runs: dict[str, list[float]] = {"free": [], "json": [], "json_default": [], "json_jump_forward": []}
        toks: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, params in (
                ("free", free),
                ("json", json_params(False)),
                ("json_default", json_params(None)),  # the device's default (CUDA: start + stop only)
                ("json_jump_forward", json_params(True)),
            ):
                await engine.flush_cache()
                t0 = time.perf_counter()
                outs = await engine.generate_many(prompts, params)
                runs[name].append(time.perf_counter() - t0)
                toks[name] = sum(len(o.token_ids) for o in outs)
        best = {k: min(v) for k, v in runs.items()}
        tps = {k: toks[k] / best[k] for k in runs}
        return {
            "batch": args.batch,
            "tokens": toks,
            "wall_s_runs": runs,
            "tokens_per_s": tps,
            "json_vs_free": tps["json"] / tps["free"],
            "json_default_vs_free": tps["json_default"] / tps["free"],
            "json_jump_forward_vs_free": tps["json_jump_forward"] / tps["free"],
        }


async def cpu_run(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from radixserve import AsyncEngine, EngineConfig

    async with AsyncEngine(
        EngineConfig(model=args.model, device=args.device, load_format=args.load_format)
    ) as engine:
        ok, comp = await compile_all(engine, rows)
        gen = await generate_all(engine, ok, args.max_tokens)
        fixed = [r for r in ok if fixed_keys(r["schema"])][: args.jf_limit]
        jf = await jump_forward_ab(engine, fixed, args.max_tokens)
        await engine.check_integrity()
    return {"compile": comp, "generate": gen, "jump_forward": jf}


async def jump_forward_run(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The jump-forward A/B alone, with overlap on and (for reference) in lockstep."""
    from radixserve import AsyncEngine, EngineConfig

    fig: dict[str, Any] = {}
    # "overlap-no-hold": overlap as on CUDA, where the step in flight is not processed
    # first, so a jump discards its token (SchedulerConfig.hold_for_jumps).
    for mode, overlap in (("overlap", True), ("overlap-no-hold", True), ("lockstep", False)):
        cfg = EngineConfig(
            model=args.model, device=args.device, load_format=args.load_format, overlap=overlap
        )
        async with AsyncEngine(cfg) as engine:
            if mode == "overlap-no-hold":
                assert engine.scheduler is not None
                engine.scheduler.running.hold_for_jumps = False
            ok, _ = await compile_all(engine, rows)
            fixed = [r for r in ok if fixed_keys(r["schema"])][: args.jf_limit]
            fig[mode] = await jump_forward_ab(engine, fixed, args.max_tokens)
            fig[mode]["schema_ids"] = [r["id"] for r in fixed]
            await engine.check_integrity()
    return fig


def print_jump_forward(j: dict[str, Any], title: str = "") -> None:
    print_table(
        [f"jump-forward {title}".strip(), "requests", "forward passes", "tokens", "valid/finished", "wall s"],
        [
            [
                k,
                j[k]["requests"],
                j[k]["forward_passes"],
                j[k]["output_tokens"],
                f"{j[k]['valid']}/{j[k]['grammar_finished']}",
                j[k]["wall_s"],
            ]
            for k in ("off", "on")
        ],
    )
    print(
        f"forward passes off/on: {j['forward_pass_ratio_off_over_on']:.2f}x, "
        f"wall off/on: {j['wall_ratio_off_over_on']:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemas", nargs="?", type=Path, default=DEFAULT_SCHEMAS)
    ap.add_argument("--limit", type=int, default=None, help="only the first N schemas")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--jf-limit", type=int, default=24, help="fixed-key schemas in the jump-forward A/B")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto")
    # "dummy" with a folder holding config and tokenizer files: random weights, the real
    # tokenizer (a GPU machine without the embedded model's package).
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--gpu-throughput", action="store_true")
    ap.add_argument("--only", choices=["jump-forward"], default=None, help="run only this part (CPU)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    env = environment()
    rows = load_schemas(args.schemas, args.limit)
    if args.gpu_throughput:
        fig = asyncio.run(gpu_throughput(args, rows))
        out = args.out or ROOT / "benchmarks" / "results" / "structured_gpu.json"
        write_results(out, [record("structured-gpu-throughput", args.model, "auto", args.device, fig)], env)
        print_table(
            ["run", "tokens", "best wall s", "tok/s", "vs free"],
            [
                [k, fig["tokens"][k], min(fig["wall_s_runs"][k]), v, v / fig["tokens_per_s"]["free"]]
                for k, v in fig["tokens_per_s"].items()
            ],
        )
        print(f"wrote {out}")
        return
    if args.only == "jump-forward":
        fig = asyncio.run(jump_forward_run(args, rows))
        out = args.out or ROOT / "benchmarks" / "results" / "structured_jump_forward_cpu.json"
        write_results(
            out, [record("jump-forward", args.model, "float32", args.device, fig)], env, limit=args.limit
        )
        for mode in fig:
            print_jump_forward(fig[mode], mode)
        print(f"wrote {out}")
        return
    fig = asyncio.run(cpu_run(args, rows))
    out = args.out or ROOT / "benchmarks" / "results" / "structured_cpu.json"
    write_results(
        out, [record("jsonschemabench", args.model, "float32", args.device, fig)], env, limit=args.limit
    )
    c, g, j = fig["compile"], fig["generate"], fig["jump_forward"]
    print_table(
        ["schemas", "compiled", "rate", "compile p50 s", "compile p99 s"],
        [[c["schemas"], c["compiled"], c["compile_rate"], c["compile_s_p50"], c["compile_s_p99"]]],
    )
    print_table(["compile failure reason", "schemas"], list(c["failures_by_reason"].items()))
    print_table(
        [
            "mode",
            "requests",
            "grammar-finished",
            "valid",
            "invalid",
            "unverifiable",
        ],
        [
            [
                m,
                g[m]["requests"],
                g[m]["grammar_finished"],
                g[m]["valid"],
                len(g[m]["invalid"]),
                len(g[m]["unverifiable"]),
            ]
            for m in ("greedy", "seeded")
        ],
    )
    print(f"both modes at once: {g['wall_s']:.1f} s wall, mask fill {g['mask_fill_us_per_token']:.1f} µs/row")
    print_jump_forward(j)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
