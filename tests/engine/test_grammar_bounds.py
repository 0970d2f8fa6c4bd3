"""Hostile grammars through the public API: every request ends, the engine serves on.

A schema whose objects always require another object (`{"next": {"next": ...`) has no
finite output: xgrammar's jump-forward search once looped forever on it, holding the GIL.
It now fails its own request at compile time, in both overlap modes and with jump-forward
left to the device or forced on. Where such a rule is only one branch (`anyOf`), the
schema decodes bounded by max_tokens (no jump-forward search); where the recursion is
optional (a linked list), jump-forward stays on and the output is valid JSON.

Compiles that run past `grammar_compile_timeout` fail their request and do not hold up
a quick compile behind them, nor `shutdown()`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jsonschema
import pytest

from radixserve import AsyncEngine, SamplingParams

from .conftest import engine_config, run, with_engine

pytestmark = pytest.mark.timeout(240)

NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}
RECURSIVE = {"$ref": "#/$defs/n", "$defs": {"n": NODE}}
UNDER_ANYOF = {
    "type": "object",
    "properties": {"a": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/n"}]}},
    "required": ["a"],
    "$defs": {"n": NODE},
}
LINKED = {
    "$ref": "#/$defs/node",
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"value": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
            "required": ["value"],
        }
    },
}
ASK = "Answer in JSON: a linked list of three numbers."
NODE_QUESTION = "Answer in JSON: a list node holding the number 7 and nothing after it."
ASK_NODE = [{"role": "user", "content": NODE_QUESTION}]
BOUND_S = 60.0  # per batch of requests; a hang shows as a timeout


async def _all_free(engine: AsyncEngine) -> None:
    await engine.check_integrity()
    assert await engine.flush_cache()
    stats = await engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["free_slots"] == stats["total_slots"]
    assert engine.healthy


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "lockstep"])
def test_recursive_schemas_end_and_the_engine_serves_on(overlap: bool) -> None:
    async def body(engine: AsyncEngine) -> None:
        for jump in (None, True):
            jf: dict[str, Any] = dict(jump_forward=jump)
            params = [
                SamplingParams(json_schema=RECURSIVE, max_tokens=32, temperature=0, **jf),
                SamplingParams(json_schema=UNDER_ANYOF, max_tokens=32, temperature=0, **jf),
                SamplingParams(json_schema=UNDER_ANYOF, max_tokens=24, temperature=1.0, seed=5, **jf),
                SamplingParams(json_schema=LINKED, max_tokens=64, temperature=0, **jf),
                SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),  # a bystander
            ]
            prompts: list[Any] = [ASK, ASK, ASK, ASK_NODE, ASK]
            calls = (engine.complete(q, p) for q, p in zip(prompts, params))
            outs: list[Any] = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), BOUND_S)
            recursive, anyof_greedy, anyof_seeded, linked, bystander = outs
            assert isinstance(recursive, ValueError), recursive
            assert "admits no finite output" in str(recursive) and "json_schema" in str(recursive)
            for out, p in ((anyof_greedy, params[1]), (anyof_seeded, params[2])):
                assert not isinstance(out, BaseException), out
                assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= p.max_tokens
                if out.finish_reason == "stop":
                    jsonschema.validate(json.loads(out.text), UNDER_ANYOF)
            assert not isinstance(linked, BaseException), linked
            assert linked.finish_reason == "stop", linked.text
            value = json.loads(linked.text)
            jsonschema.validate(value, LINKED)
            assert "next" in value  # the optional recursion was taken (`{"value": 7, "next": {...}}`)
            if jump:  # an optional recursion keeps jump-forward (`{"value": ` is forced)
                assert linked.usage.jump_forward_tokens > 0
            assert not isinstance(bystander, BaseException) and len(bystander.token_ids) == 8
            await _all_free(engine)
        normal = await engine.complete("What is 2 + 2?", SamplingParams(max_tokens=8, temperature=0))
        assert normal.token_ids

    run(with_engine, engine_config(overlap=overlap), body)


def _wide_schema(n: int, tag: str) -> dict[str, Any]:
    """An object of n properties: xgrammar's compile time grows faster than n (1,000: ~2 s)."""
    props = {f"{tag}{i}": {"type": "string"} for i in range(n)}
    return {"type": "object", "properties": props, "required": [f"{tag}0"]}


def test_slow_compile_times_out_without_starving_others_or_shutdown() -> None:
    async def body() -> None:
        cfg = engine_config(grammar_compile_timeout=0.3, grammar_compile_workers=1)
        engine = await AsyncEngine(cfg).start()
        try:
            slow = SamplingParams(json_schema=_wide_schema(1300, "slow"), max_tokens=4)
            with pytest.raises(ValueError, match="did not compile within 0.3 s"):
                await asyncio.wait_for(engine.complete(ASK, slow), BOUND_S)
            # The slow compile runs on, abandoned: it no longer holds the only compile worker.
            cache = engine.grammar_cache
            assert cache is not None and cache.abandoned == 1
            with pytest.raises(ValueError, match="did not compile"):  # the same schema: at once
                await asyncio.wait_for(engine.complete(ASK, slow), 1.0)
            quick = SamplingParams(json_schema={"type": "integer"}, max_tokens=4, temperature=0)
            out = await asyncio.wait_for(engine.complete(ASK, quick), BOUND_S)
            assert out.finish_reason in ("stop", "length") and out.text.lstrip("-").isdigit()
            await _all_free(engine)
            # Shut down while another slow compile runs, its request still waiting.
            other = SamplingParams(json_schema=_wide_schema(1300, "other"), max_tokens=4)
            waiting = asyncio.ensure_future(engine.complete(ASK, other))
            await asyncio.sleep(0.1)
            assert not waiting.done()
        finally:
            t0 = time.perf_counter()
            await asyncio.wait_for(engine.shutdown(), 10)
            assert time.perf_counter() - t0 < 5  # it never waits for a compile
        with pytest.raises(ValueError, match="did not compile|shutting down"):
            await asyncio.wait_for(waiting, BOUND_S)

    asyncio.run(body())
