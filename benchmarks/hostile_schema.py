"""Hostile JSON schemas through the public API, every run bounded: none may hang the engine.

    python benchmarks/hostile_schema.py                                   # CPU, the embedded model
    python benchmarks/hostile_schema.py --device cuda --model DIR --load-format dummy   # the H200

DIR is a folder with a model's config and tokenizer files (random weights with
`--load-format dummy`: the GPU machine has no embedded model package). Each
schema runs with overlap on and off and with `jump_forward` left to the
device's default and forced on: 3 requests at once (greedy, seeded, and a plain
bystander). A case passes when every request ends within its bound, with
output bounded by `max_tokens` or a clear per-request error, and the engine
is healthy with every KV slot accounted for afterwards. The first schema once
sent xgrammar's jump-forward into an endless loop (its forced text is
infinite: `{"next": {"next": ...`). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}
SCHEMAS: dict[str, Any] = {
    "recursive_required": {"$ref": "#/$defs/n", "$defs": {"n": NODE}},
    "recursive_in_array": {
        "type": "object",
        "properties": {"xs": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
        "required": ["xs"],
    },
    "recursive_under_anyof": {
        "type": "object",
        "properties": {"a": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/n"}]}},
        "required": ["a"],
        "$defs": {"n": NODE},
    },
}
BOUND_S = 120.0  # per case; a hang shows as a timeout


async def _case(engine: Any, schema: Any, jump: bool | None) -> dict[str, Any]:
    from radixserve import SamplingParams

    text = json.dumps(schema)
    params = [
        SamplingParams(json_schema=text, max_tokens=48, temperature=0, jump_forward=jump),
        SamplingParams(json_schema=text, max_tokens=48, temperature=0.8, seed=1, jump_forward=jump),
        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
    ]
    t0 = time.perf_counter()
    try:
        outs = await asyncio.wait_for(
            asyncio.gather(*(engine.complete("Answer in JSON.", p) for p in params), return_exceptions=True),
            BOUND_S,
        )
    except asyncio.TimeoutError:
        return {"seconds": None, "healthy": engine.healthy, "ends": [f"no answer within {BOUND_S:g} s"]}
    seconds = time.perf_counter() - t0
    ends = []
    for o in outs:
        if isinstance(o, BaseException):
            ends.append(f"{type(o).__name__}: {str(o)[:80]}")
        else:
            assert len(o.token_ids) <= 48
            ends.append(f"{o.finish_reason} after {len(o.token_ids)} tokens")
    await engine.check_integrity()
    return {"seconds": round(seconds, 2), "healthy": engine.healthy, "ends": ends}


async def _engine_cases(config: Any) -> list[dict[str, Any]]:
    from radixserve import AsyncEngine

    figures = []
    async with AsyncEngine(config) as engine:
        for name, schema in SCHEMAS.items():
            for jump in (None, True):
                fig = await _case(engine, schema, jump)
                fig.update(schema=name, overlap=config.overlap, jump_forward=jump)
                print(fig, flush=True)
                figures.append(fig)
    return figures


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import environment, print_table, record, write_results

    from radixserve import EngineConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "hostile_schema.json"))
    args = ap.parse_args()
    env = environment()
    figures: list[dict[str, Any]] = []
    for overlap in (True, False):
        cfg = EngineConfig(
            model=args.model, load_format=args.load_format, device=args.device, overlap=overlap
        )
        figures += asyncio.run(_engine_cases(cfg))
    rows = [
        (f["schema"], f["overlap"], f["jump_forward"], f["seconds"], f["healthy"], "; ".join(f["ends"]))
        for f in figures
    ]
    print_table(["schema", "overlap", "jump_forward", "seconds", "healthy", "how each request ended"], rows)
    ok = all(f["healthy"] and f["seconds"] is not None for f in figures)
    print(f"all bounded and healthy: {ok}")
    rec = record("hostile-schema", args.model, "auto", args.device, {"cases": figures})
    write_results(args.out, [rec], env)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
