"""What tool calls cost: a constrained call against plain JSON-schema decoding, and the parser.

    python benchmarks/tool_calls.py [--tools 12] [--max-tokens 128] [--repeats 2] [--out PATH]
    python benchmarks/tool_calls.py --quick        # a smoke run (1 tool, 8 tokens)

(a) decode: for N object schemas of JSONSchemaBench (../shared/data/jsonschemabench), one prompt
    each (the chat with that tool in the default Hermes tool prompt, rendered once and sent as
    token ids to both sides): a named tool call (`tools`, `tool_choice` = the function,
    `parallel_tool_calls=False`, which an xgrammar structural tag constrains and the parser
    reads) against the same prompt decoding the arguments under `json_schema`. Greedy, one
    request at a time after a warm-up that puts the prompt in the radix cache, the two sides
    interleaved; time per output token (wall / output tokens over all requests) and per sampled
    token (output tokens less the jump-forward ones, which cost no pass of their own). The call's
    markup is forced text, jump-forwarded: per output token the call looks cheaper than it is,
    and per sampled token is the fair figure of the constraint's cost. Use --max-tokens large
    enough for the arguments to dominate.
(b) parser: a long output (text, then calls with large arguments, written by each format) fed
    to the format's `ToolStream` one token's text at a time: microseconds per token.

Prints tables and writes JSON (default benchmarks/results/tool_calls_cpu.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, environment, print_table, record, write_results  # noqa: E402

_DATA = Path("shared") / "data" / "jsonschemabench" / "schemas.jsonl"
DEFAULT_SCHEMAS = next((p for p in (ROOT.parent / _DATA, ROOT / _DATA) if p.exists()), ROOT.parent / _DATA)
MODEL = "smollm2-135m-instruct"


def pick_tools(path: Path, n: int, max_chars: int = 800) -> list[dict[str, Any]]:
    """`n` object schemas (short ones: each is in its prompt) spread over the file, as tools."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [
        r for r in rows if r["schema"].get("type") == "object" and len(json.dumps(r["schema"])) <= max_chars
    ]
    step = max(1, len(rows) // max(1, n))
    return [
        {
            "type": "function",
            "function": {"name": f"tool_{i}", "description": r["id"], "parameters": r["schema"]},
        }
        for i, r in enumerate(rows[::step][:n])
    ]


async def decode_ab(
    tools: list[dict[str, Any]], max_tokens: int, repeats: int, device: str
) -> dict[str, Any]:
    from radixserve import AsyncEngine, EngineConfig, SamplingParams
    from radixserve.prompts import render_chat

    sides: dict[str, dict[str, float]] = {
        s: {"wall_s": 0.0, "tokens": 0, "sampled": 0, "requests": 0} for s in ("tool", "json")
    }
    finished = {"tool": 0, "json": 0}
    async with AsyncEngine(EngineConfig(model=MODEL, device=device, dtype="float32")) as engine:
        for tool in tools:
            fn = tool["function"]
            messages = [{"role": "user", "content": f"Call {fn['name']} with an example item."}]
            ids = engine.tokenizer.encode(
                render_chat(engine.tokenizer, messages, tools=[tool]), add_special_tokens=False
            )
            greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            choice = {"type": "function", "function": {"name": fn["name"]}}

            runs: dict[str, tuple[Any, Any, dict[str, Any]]] = {
                "tool": (messages, greedy, dict(tools=[tool], tool_choice=choice, parallel_tool_calls=False)),
                "json": (ids, greedy.replace(json_schema=fn["parameters"]), {}),
            }
            for prompt, params, kw in runs.values():  # warm-up: the prompt's KV cached, grammars compiled
                await engine.complete(prompt, params, **kw)
            for _ in range(repeats):
                for side, (prompt, params, kw) in runs.items():
                    t0 = time.perf_counter()
                    out = await engine.complete(prompt, params, **kw)
                    sides[side]["wall_s"] += time.perf_counter() - t0
                    sides[side]["tokens"] += len(out.token_ids)
                    sides[side]["sampled"] += len(out.token_ids) - out.usage.jump_forward_tokens
                    sides[side]["requests"] += 1
                    finished[side] += out.finish_reason in ("stop", "tool_calls")
    fig: dict[str, Any] = {}
    for side, s in sides.items():
        fig[side] = {
            **s,
            "ms_per_token": 1e3 * s["wall_s"] / max(1, s["tokens"]),
            "ms_per_sampled_token": 1e3 * s["wall_s"] / max(1, s["sampled"]),
            "finished": finished[side],
        }
    fig["ratio_tool_over_json"] = fig["tool"]["ms_per_token"] / fig["json"]["ms_per_token"]
    fig["ratio_sampled_tool_over_json"] = (
        fig["tool"]["ms_per_sampled_token"] / fig["json"]["ms_per_sampled_token"]
    )
    return fig


def long_output(parser: Any, calls: int, arg_chars: int) -> str:
    from radixserve.tools import ToolCall

    args = json.dumps(
        {"query": "radix " * (arg_chars // 6), "limit": 10, "tags": ["a", "b"], "deep": {"x": [1, 2]}}
    )
    text = "Let me look that up for you, step by step, before I answer.\n" * 20
    return text + parser.write_calls([ToolCall(f"call_{i}", "search", args) for i in range(calls)])


def parser_cost(tokenizer: Any, calls: int, arg_chars: int, repeats: int) -> dict[str, Any]:
    from radixserve.tools import FunctionSpec, tool_parser

    fig: dict[str, Any] = {}
    for name in ("hermes", "llama3", "mistral"):
        parser = tool_parser(name, [FunctionSpec("search")])
        text = long_output(parser, calls, arg_chars)
        pieces = [tokenizer.decode([t]) for t in tokenizer.encode(text, add_special_tokens=False)]
        assert "".join(pieces) == text  # ASCII text: every token decodes on its own
        best = float("inf")
        for _ in range(repeats):
            stream = parser.stream()
            t0 = time.perf_counter()
            got = [stream.feed(p) for p in pieces]
            got.append(stream.finish())
            best = min(best, time.perf_counter() - t0)
        made = sum(1 for d in got for c in d.tool_calls if c.id is not None)
        assert made == calls, (name, made)
        fig[name] = {"tokens": len(pieces), "calls": calls, "us_per_token": 1e6 * best / len(pieces)}
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemas", type=Path, default=DEFAULT_SCHEMAS)
    ap.add_argument("--tools", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=8, help="calls in the parser's long output")
    ap.add_argument("--arg-chars", type=int, default=2000, help="characters of each call's arguments")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 tool, 8 tokens, small output")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/tool_calls_cpu.json")
    args = ap.parse_args()
    if args.quick:
        args.tools, args.max_tokens, args.repeats, args.calls, args.arg_chars = 1, 8, 2, 2, 200
    env = environment()
    import torch
    from transformers import AutoTokenizer

    from radixserve.model.embedded import embedded_model_dir

    torch.set_num_threads(1)  # the engine's tests' setting: steady figures on a busy machine
    tools = pick_tools(args.schemas, args.tools)
    dec = asyncio.run(decode_ab(tools, args.max_tokens, args.repeats, args.device))
    heads = ["decode", "requests", "finished", "tokens", "sampled", "wall s", "ms/token", "ms/sampled token"]
    print_table(
        heads,
        [
            [
                s,
                *(
                    dec[s][k]
                    for k in (
                        "requests",
                        "finished",
                        "tokens",
                        "sampled",
                        "wall_s",
                        "ms_per_token",
                        "ms_per_sampled_token",
                    )
                ),
            ]
            for s in ("tool", "json")
        ],
    )
    print(
        f"tool call / json_schema time per token: {dec['ratio_tool_over_json']:.3f}, per sampled token "
        f"(jump-forward tokens left out): {dec['ratio_sampled_tool_over_json']:.3f} (target <= 1.05)"
    )
    par = parser_cost(AutoTokenizer.from_pretrained(embedded_model_dir()), args.calls, args.arg_chars, 3)
    print_table(
        ["parser", "tokens", "calls", "us/token"],
        [[n, f["tokens"], f["calls"], f["us_per_token"]] for n, f in par.items()],
    )
    results = [
        record(
            "tool_call_vs_json_schema",
            MODEL,
            "float32",
            args.device,
            dec,
            tools=args.tools,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
        ),
        record("tool_parser_stream", MODEL, "-", "cpu", par, arg_chars=args.arg_chars),
    ]
    print(f"wrote {write_results(args.out, results, env, quick=args.quick)}")


if __name__ == "__main__":
    main()
