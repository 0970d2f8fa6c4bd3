"""Structured output through the public API: JSON schema, regex, EBNF, choice, jump-forward.

Greedy references come from transformers' `generate` with xgrammar's own
transformers logits processor over the same compiled grammar; both overlap
modes must give those tokens (the overlap-off engine also chunks prefills).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import jsonschema
import pydantic
import pytest

from radixserve import Engine, SamplingParams

from .conftest import engine_config, hf_greedy


class Person(pydantic.BaseModel):
    name: str
    age: int
    city: str


PERSON_DICT = Person.model_json_schema()
ITEM = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "tags"],
}
ARITH = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= num | "(" expr ")"\nnum ::= [0-9]+'


def chat(q: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}]


ASK_PERSON = chat("Describe a person as JSON with name, age and city.")
ASK_ITEM = chat("Give a JSON object for an item with an id and some tags.")


@pytest.fixture(scope="module", params=[True, False], ids=["overlap", "lockstep"])
def engine(request: Any) -> Any:
    overlap = request.param
    eng = Engine(engine_config(overlap=overlap, chunked_prefill_size=8192 if overlap else 16))
    yield eng
    eng.check_integrity()
    eng.close()


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", 40), **kw)


_HF_REFS: dict[tuple[str, str, int], list[int]] = {}  # shared by both engines' runs


def hf_constrained(engine: Engine, hf_model: Any, tokenizer: Any, messages: Any, sp: SamplingParams) -> Any:
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    assert engine.engine.grammar_cache is not None and sp.grammar is not None
    key = (json.dumps(messages), sp.grammar.text, sp.max_tokens)
    if key in _HF_REFS:
        return _HF_REFS[key]
    compiled = engine.engine.grammar_cache.backend.compile(sp.grammar)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    procs = LogitsProcessorList([LogitsProcessor(compiled.grammar)])
    _HF_REFS[key] = hf_greedy(hf_model, ids, sp.max_tokens, logits_processor=procs)
    return _HF_REFS[key]


def test_json_schema_dict_str_pydantic_match_transformers(
    engine: Engine, hf_model: Any, tokenizer: Any
) -> None:
    params = [
        greedy(json_schema=Person, jump_forward=False),
        greedy(json_schema=json.dumps(ITEM), jump_forward=False),
        greedy(json_schema=PERSON_DICT, jump_forward=False),
    ]
    assert params[0].json_schema == params[2].json_schema  # one canonical text, one compile
    outs = engine.generate_many([ASK_PERSON, ASK_ITEM, ASK_PERSON], params)
    for out, sp, msgs, schema in zip(outs, params, [ASK_PERSON, ASK_ITEM, ASK_PERSON], [PERSON_DICT, ITEM]):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
        assert list(out.token_ids) == hf_constrained(engine, hf_model, tokenizer, msgs, sp)
    Person.model_validate_json(outs[0].text)


def test_regex_ebnf_choice(engine: Engine) -> None:
    regex = r"[A-Z][a-z]+ [0-9]{2,3}(, [a-z]+)?"
    choices = ["red", "green", "light blue"]
    prompts = [chat("Name and number?"), chat("Write a sum."), chat("Pick a color."), chat("A color?")]
    params = [
        greedy(regex=regex),
        greedy(ebnf=ARITH, max_tokens=24),
        greedy(choice=choices),
        SamplingParams(temperature=1.0, seed=3, n=3, choice=choices),
    ]
    outs = engine.generate_many(prompts, params)
    assert outs[0].finish_reason == "stop" and re.fullmatch(regex, outs[0].text), outs[0].text
    text = outs[1].text
    if outs[1].finish_reason == "stop":  # a complete expression: Python parses it the same way
        assert re.fullmatch(r"[0-9+\-()]+", text) and isinstance(ast.parse(text, mode="eval"), ast.Expression)
    assert outs[2].text in choices and outs[2].finish_reason == "stop"
    assert all(o.text in choices and o.finish_reason == "stop" for o in outs[3])


def test_bad_grammar_fails_only_its_request(engine: Engine) -> None:
    cases = [
        (dict(json_schema={"type": "strin"}), "json_schema"),
        (dict(json_schema={"$ref": "#/$defs/missing"}), "json_schema"),
        (dict(regex="(unclosed"), "regex"),
        (dict(ebnf="root ::= undefined_rule"), "ebnf"),
    ]
    for kw, kind in cases:
        for _ in range(2):  # the second time the failure comes from the cache
            with pytest.raises(ValueError, match=kind):
                engine.complete(ASK_PERSON, SamplingParams(max_tokens=4, **kw))
    with pytest.raises(ValueError, match="json_schema"):
        SamplingParams(json_schema="{not json")
    with pytest.raises(ValueError, match="exclusive"):
        SamplingParams(regex="a", choice=["a"])
    assert engine.engine.healthy
    out = engine.complete(ASK_PERSON, greedy(json_schema=Person))
    Person.model_validate_json(out.text)


def test_length_gives_a_valid_prefix(engine: Engine) -> None:
    out = engine.complete(ASK_PERSON, greedy(json_schema=Person, max_tokens=6))
    assert out.finish_reason == "length" and len(out.token_ids) == 6
    cache = engine.engine.grammar_cache
    assert cache is not None
    m = cache.backend.matcher(cache.backend.compile(SamplingParams(json_schema=Person).grammar))  # type: ignore[arg-type]
    assert all(m.accept_token(t) for t in out.token_ids) and not m.is_terminated()


def test_jump_forward_is_valid_and_saves_forward_passes(engine: Engine) -> None:
    """Fixed-key schemas: the keys and separators are forced strings, and so are the
    opening `{"name": "` (it goes in with the prompt) and the closing EOS."""
    results = {}
    for jf in (False, True):
        before = engine.stats()
        if jf:  # streamed: the deltas carry every token, forced ones included
            chunks = list(
                engine.generate(ASK_PERSON, greedy(json_schema=Person, max_tokens=48, jump_forward=jf))
            )
            out = chunks[-1]
            assert [t for c in chunks for t in c.delta_token_ids] == list(out.token_ids)
            assert "".join(c.delta_text for c in chunks) == out.text
        else:
            out = engine.complete(ASK_PERSON, greedy(json_schema=Person, max_tokens=48, jump_forward=jf))
        after = engine.stats()
        assert out.finish_reason == "stop"
        Person.model_validate_json(out.text)
        results[jf] = (out, after["forward_steps"] - before["forward_steps"])
    (plain, steps_off), (jumped, steps_on) = results[False], results[True]
    assert jumped.usage.jump_forward_tokens > 0 and plain.usage.jump_forward_tokens == 0
    assert jumped.text == plain.text  # same greedy object here; ids may differ at jump boundaries
    if engine.engine.config.overlap:
        # On the CPU the overlap worker processes the step in flight before a jump-forward
        # request's next step (SchedulerConfig.hold_for_jumps): no pass is spent on a token
        # that a jump discards, so every pass samples one kept token.
        assert steps_on == len(jumped.token_ids) - jumped.usage.jump_forward_tokens
        assert 2 * steps_on <= steps_off  # the target on this schema
    else:
        assert steps_on < steps_off
    seeded = engine.complete(ASK_ITEM, SamplingParams(max_tokens=48, seed=7, n=2, json_schema=ITEM))
    for o in seeded:
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(o.text), ITEM)


def test_jump_forward_equal_in_both_overlap_modes(tokenizer: Any) -> None:
    """Greedy outputs with jump-forward on, batched, under a pool small enough to retract.

    Overlap runs without the CPU's hold, as on CUDA, where a jump discards the token in
    flight (the hold, which makes overlap process each step first, is checked above)."""
    prompts = [ASK_PERSON, ASK_ITEM, chat("Another person, as JSON."), chat("One more item, as JSON.")]
    params = [greedy(json_schema=Person), greedy(json_schema=ITEM)] * 2
    got = []
    for overlap, hold in ((True, False), (False, True)):
        eng = Engine(engine_config(overlap=overlap, kv_cache_tokens=110, decode_reserve_ratio=0.0))
        sched = eng.engine.scheduler
        assert sched is not None and sched.running.hold_for_jumps
        sched.running.hold_for_jumps = hold
        try:
            outs = eng.generate_many(prompts, params)
            stats = eng.stats()
            eng.check_integrity()
        finally:
            eng.close()
        assert stats["retractions"] > 0 and stats["jump_forward_tokens"] > 0
        # Without the hold some jumps discard an in-flight token; in lockstep none do.
        discarded = stats["jump_forward_tokens"] - stats["forward_passes_saved"]
        assert discarded > 0 if overlap else discarded == 0
        for o, sp in zip(outs, params):
            if o.finish_reason == "stop":
                jsonschema.validate(json.loads(o.text), json.loads(sp.json_schema))
        got.append([list(o.token_ids) for o in outs])
    assert got[0] == got[1]
