"""The xgrammar backend alone: tokenizer info, masks, forced strings, the compile cache."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from radixserve.constrained.cache import GrammarCache
from radixserve.constrained.spec import GrammarSpec
from radixserve.constrained.xgrammar_backend import XGrammarBackend, special_token_ids
from radixserve.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> XGrammarBackend:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return XGrammarBackend(tokenizer, len(tokenizer.get_vocab()) + 64, [eos])  # 64 padded LM-head rows


def allowed(backend: XGrammarBackend, m: Any) -> torch.Tensor:
    bm = backend.allocate_bitmask(1)
    m.fill_bitmask(bm, 0)
    bits = (bm[0][:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[: backend.vocab_size].bool()


def finishes(
    backend: XGrammarBackend, tokenizer: Any, grammar: GrammarSpec | dict[str, Any], text: str
) -> bool:
    """The grammar (a spec, or a JSON schema) accepts `text` and then its stop token."""
    spec = grammar if isinstance(grammar, GrammarSpec) else SamplingParams(json_schema=grammar).grammar
    assert spec is not None
    m = backend.matcher(backend.compile(spec))
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(m.accept_token(t) for t in ids) and m.accept_token(backend.info.stop_token_ids[0])


def test_special_tokens_padding_and_eos_in_masks(backend: XGrammarBackend, tokenizer: Any) -> None:
    spec = SamplingParams(json_schema={"type": "object", "properties": {"a": {"type": "string"}}}).grammar
    assert spec is not None
    m = backend.matcher(backend.compile(spec))
    for t in tokenizer.encode('{"a": "', add_special_tokens=False):
        assert m.accept_token(t)
    ok = allowed(backend, m)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    specials = special_token_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in specials
    assert not any(ok[i] for i in specials)  # inside a JSON string: never a special token
    assert not ok[len(tokenizer.get_vocab()) :].any()  # padded rows never
    assert ok.sum() > 1000  # but string content is free
    assert m.forced_stop() is None
    for t in tokenizer.encode('x"}', add_special_tokens=False):
        assert m.accept_token(t)
    ok = allowed(backend, m)
    assert ok[eos] and ok.sum() == 1  # complete: only EOS
    assert m.forced_stop() == eos  # what jump-forward appends to end the request
    assert m.accept_token(eos) and m.is_terminated()
    digits = backend.matcher(backend.compile(GrammarSpec("regex", "[0-9]+")))
    for t in tokenizer.encode("12", add_special_tokens=False):
        assert digits.accept_token(t)
    assert allowed(backend, digits)[eos] and digits.forced_stop() is None  # complete, but may go on


def test_forced_string_and_rollback(backend: XGrammarBackend, tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    m = backend.matcher(backend.compile(SamplingParams(json_schema=schema).grammar))  # type: ignore[arg-type]
    assert m.forced_string() == '{"name": "'
    ids = tokenizer.encode('{"name": "', add_special_tokens=False)
    assert all(m.accept_token(t) for t in ids) and m.forced_string() == ""
    m.rollback(len(ids))
    assert m.forced_string() == '{"name": "'


def test_cache_shares_compiles_and_keeps_failures(backend: XGrammarBackend) -> None:
    cache = GrammarCache(backend, capacity=2, timeout_s=30)
    good = GrammarSpec("regex", "[a-z]+")
    bad = GrammarSpec("regex", "[a-")

    async def body() -> None:
        a, b = await asyncio.gather(cache.get(good), cache.get(good))
        assert a is b
        for _ in range(2):
            with pytest.raises(ValueError, match="regex"):
                await cache.get(bad)
        await cache.get(GrammarSpec("regex", "[0-9]+"))
        assert len(cache) == 2  # bounded LRU

    asyncio.run(body())
    assert len(cache.compile_times) == 3 and cache.hits == 2


def test_schemas_as_users_write_them_compile_to_what_they_mean(backend: XGrammarBackend) -> None:
    from radixserve.constrained.json_schema import prepare

    # An array without `items` means any items (strict mode alone would allow only []).
    arr = {"type": "array", "minItems": 1}
    assert prepare(arr)["items"] == {}
    m = backend.matcher(backend.compile(SamplingParams(json_schema=arr).grammar))  # type: ignore[arg-type]
    assert m.forced_string() == "["
    # allOf of a $ref and more properties: one object with both.
    schema = {
        "$defs": {"a": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}},
        "allOf": [{"$ref": "#/$defs/a"}, {"properties": {"y": {"type": "number", "multipleOf": 2}}}],
    }
    got = prepare(schema)
    assert "allOf" not in got and got["required"] == ["x"]
    assert got["properties"]["y"] == {"type": "integer", "multipleOf": 2}
    assert schema["allOf"][0] == {"$ref": "#/$defs/a"}  # the caller's schema is not touched


def test_length_bounded_strings_refuse_control_characters(backend: XGrammarBackend, tokenizer: Any) -> None:
    # xgrammar's own maxLength string rule accepts a raw \x01 (JSON forbids it); the JSON
    # vocabulary (no tokens with a raw control character) must refuse it; the bound holds.
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 4}},
        "required": ["name"],
    }
    compiled = backend.compile(SamplingParams(json_schema=schema).grammar)  # type: ignore[arg-type]

    def accepts(text: str) -> bool:
        m = backend.matcher(compiled)
        return all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts('{"name": "ab"}') and accepts('{"name": "abcd"}')
    assert not accepts('{"name": "a\x01b"}')
    assert not accepts('{"name": "abcde"}')


def test_keywords_beside_branches_refs_and_conditionals_are_enforced(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    # Shapes from JSONSchemaBench where xgrammar alone accepted invalid text (found with
    # random-weight generation): each rewrite in json_schema.prepare must make them refused.
    def accepts(grammar: Any, text: str) -> bool:
        return finishes(backend, tokenizer, grammar, text)

    side = {"type": "object", "properties": {"align": {"enum": ["left", "right"]}}, "required": ["align"]}
    beside_one_of = {
        "type": "object",
        "required": ["content"],
        "properties": {"content": {"type": "string"}},
        "oneOf": [{"$ref": "#/definitions/side"}],
        "definitions": {"side": {"properties": {"config": side}, "required": ["config"]}},
    }
    assert not accepts(beside_one_of, '{"config": {"align": "left"}}')  # the sibling `required`
    assert accepts(beside_one_of, '{"content": "x", "config": {"align": "left"}}')

    root_ref = {
        "$ref": "#/definitions/App",
        "definitions": {
            "App": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        },
    }
    assert not accepts(root_ref, "null") and accepts(root_ref, '{"n": 1}')

    conditional = {
        "type": "object",
        "properties": {"kind": {"type": "string", "enum": ["a", "b", "c"]}},
        "required": ["kind"],
        "allOf": [
            {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"properties": {"x": {"enum": [1, 2]}}}},
            {
                "if": {"properties": {"kind": {"const": "b"}}},
                "then": {"properties": {"y": {"type": "boolean"}}},
            },
        ],
    }
    assert not accepts(conditional, "null")
    assert accepts(conditional, '{"kind": "a", "x": 2}') and not accepts(conditional, '{"kind": "a", "x": 3}')
    assert accepts(conditional, '{"kind": "b", "y": true}') and accepts(conditional, '{"kind": "c"}')
    assert not accepts(conditional, '{"kind": "d"}')


def test_lengths_beside_a_pattern_required_names_and_typed_enums(
    backend: XGrammarBackend, tokenizer: Any
) -> None:
    def accepts(grammar: Any, text: str) -> bool:
        return finishes(backend, tokenizer, grammar, text)

    slug = {"type": "string", "minLength": 2, "maxLength": 3, "pattern": "^[a-z-]*$"}
    assert accepts(slug, '"ab"') and not accepts(slug, '""') and not accepts(slug, '"abcd"')
    missing = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}
    assert not accepts(missing, '{"a": "x"}')  # strict mode alone never writes "b"
    assert accepts(missing, '{"a": "x", "b": 1}')
    wrong_enum = {"type": "object", "properties": {"t": {"type": "array", "enum": ["code"]}}}
    assert not accepts(wrong_enum, '{"t": "code"}') and accepts(wrong_enum, "{}")


def test_optional_group_ending_in_a_repeat(backend: XGrammarBackend, tokenizer: Any) -> None:
    # xgrammar alone reads `(ab*)?` as `a?b*`: "//" passed for a URL-path pattern.
    def accepts(grammar: Any, text: str) -> bool:
        return finishes(backend, tokenizer, grammar, text)

    path = "^/([a-z]+(/[a-z]*)*)?$"
    schema = GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": path}))
    assert accepts(schema, '"/ab/c"') and accepts(schema, '"/"') and not accepts(schema, '"//"')
    regex = GrammarSpec("regex", "x(ab*)?")
    assert accepts(regex, "xabb") and accepts(regex, "x") and not accepts(regex, "xb")
