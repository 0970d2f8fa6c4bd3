"""Random walks through each schema's grammar: is every text it can finish valid?

    python benchmarks/fuzz_schemas.py [SCHEMAS] [--walks 4] [--max-tokens 400]

No model: for every schema of SCHEMAS (default: JSONSchemaBench, as in
bench_structured.py) the engine's grammar (json_schema.prepare + xgrammar,
the embedded model's vocabulary) is walked token by token, each step picking
uniformly among the allowed tokens (60% of the time among "structural" ones:
quotes, brackets, digits, literals, so that walks finish) and taking the stop
token with probability 0.7 where it is allowed. Every finished walk is
validated with `jsonschema` against the original schema. Random walks reach
corners a trained model rarely visits; they found every gap listed in
constrained/json_schema.py's docstring. Seeded: the same tree gives the same walks.
Prints a table and writes JSON under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_structured import DEFAULT_SCHEMAS, load_schemas, validate  # noqa: E402
from common import ROOT, environment, print_table, record, write_results  # noqa: E402


def walk(
    backend: Any, compiled: Any, rng: random.Random, structural: np.ndarray, stop: int, limit: int
) -> list[int] | None:
    """Token ids of one finished walk, or None when it did not finish within `limit` tokens."""
    m = backend.matcher(compiled)
    bitmask = backend.allocate_bitmask(1)
    ids: list[int] = []
    for _ in range(limit):
        m.fill_bitmask(bitmask, 0)
        allowed = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[: len(structural)]
        allowed = allowed.astype(bool)
        if allowed[stop] and rng.random() < 0.7:
            return ids if m.accept_token(stop) else None
        pick = np.flatnonzero(allowed & structural) if rng.random() < 0.6 else np.flatnonzero(allowed)
        if len(pick) == 0:
            pick = np.flatnonzero(allowed)
        tok = int(pick[rng.randrange(len(pick))])
        if not m.accept_token(tok):
            raise AssertionError(f"the matcher refused token {tok} that its own mask allowed")
        if tok == stop:
            return ids
        ids.append(tok)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemas", nargs="?", type=Path, default=DEFAULT_SCHEMAS)
    ap.add_argument("--walks", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz_schemas.json")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from radixserve.constrained.xgrammar_backend import XGrammarBackend
    from radixserve.model.embedded import embedded_model_dir
    from radixserve.sampling_params import SamplingParams

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    vocab = len(tok.get_vocab())
    backend = XGrammarBackend(tok, vocab, [stop])
    texts = [tok.decode([i]) for i in range(vocab)]
    structural = np.array(
        [any(c in t for c in '"{}[],:0123456789') or t.strip() in ("true", "false", "null") for t in texts]
    )
    rng = random.Random(0)
    rows = load_schemas(args.schemas, args.limit)
    env = environment()
    t0 = time.perf_counter()
    compiled_n = walks = finished = 0
    invalid: list[dict[str, str]] = []
    for row in rows:
        try:
            compiled = backend.compile(SamplingParams(json_schema=row["schema"]).grammar)  # type: ignore[arg-type]
        except ValueError:
            continue
        compiled_n += 1
        for _ in range(args.walks):
            walks += 1
            ids = walk(backend, compiled, rng, structural, stop, args.max_tokens)
            if ids is None:
                continue
            finished += 1
            text = tok.decode(ids)
            why = validate(text, row["schema"])
            if why is not None and not why.startswith("unverifiable"):
                invalid.append({"id": row["id"], "why": why[:200], "text": text[:300]})
    fig = {
        "schemas": len(rows),
        "compiled": compiled_n,
        "walks": walks,
        "finished": finished,
        "invalid": len(invalid),
        "invalid_schemas": sorted({x["id"] for x in invalid}),
        "invalid_walks": invalid,
        "seconds": time.perf_counter() - t0,
    }
    write_results(
        args.out, [record("fuzz-schemas", "smollm2-135m-instruct vocabulary", "-", "cpu", fig)], env
    )
    print_table(
        ["schemas", "compiled", "walks", "finished", "invalid", "schemas with invalid", "seconds"],
        [[len(rows), compiled_n, walks, finished, len(invalid), len(fig["invalid_schemas"]), fig["seconds"]]],
    )
    for x in invalid[:20]:
        print(x["id"], x["why"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
