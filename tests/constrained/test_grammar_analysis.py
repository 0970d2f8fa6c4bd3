"""Grammars with no finite output fail to compile; jump-forward searches only where it ends."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
import xgrammar as xgr

from radixserve import SamplingParams
from radixserve.constrained import xgrammar_backend as xb
from radixserve.constrained.grammar_analysis import MAX_FORCED, analyze
from radixserve.constrained.json_schema import prepare
from radixserve.constrained.spec import GrammarSpec

pytestmark = pytest.mark.timeout(60)

NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}
RECURSIVE = {"$ref": "#/$defs/n", "$defs": {"n": NODE}}
IN_ARRAY = {
    "type": "object",
    "properties": {"xs": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
    "required": ["xs"],
}
UNDER_ANYOF = {
    "type": "object",
    "properties": {"a": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/n"}]}},
    "required": ["a"],
    "$defs": {"n": NODE},
}
LINKED = {
    "$ref": "#/$defs/n",
    "$defs": {
        "n": {
            "type": "object",
            "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/n"}},
            "required": ["v"],
        }
    },
}


def schema_ebnf(schema: dict[str, Any]) -> str:
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(prepare(schema)), any_whitespace=False, separators=(", ", ": ")
    )
    return str(grammar)


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> xb.XGrammarBackend:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return xb.XGrammarBackend(tokenizer, len(tokenizer.get_vocab()), [eos])


def test_shortest_outputs_and_jump_safety() -> None:
    for schema in (RECURSIVE, IN_ARRAY):
        facts = analyze(schema_ebnf(schema))
        assert facts is not None and facts.shortest == math.inf and not facts.admits_output
    facts = analyze(schema_ebnf(UNDER_ANYOF))  # `{"a": 0}`; the other branch never ends
    assert facts is not None and facts.shortest == len('{"a": 0}') and not facts.jump_safe
    facts = analyze(schema_ebnf(LINKED))
    assert facts is not None and facts.shortest == len('{"v": 0}') and facts.jump_safe
    arith = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= num | "(" expr ")"\nnum ::= [0-9]+'
    facts = analyze(str(xgr.Grammar.from_ebnf(arith)))
    assert facts is not None and facts.shortest == 1 and facts.jump_safe
    facts = analyze(str(xgr.Grammar.from_regex(r"[a-z]{2,5}(x|y)*\d+")))
    assert facts is not None and facts.shortest == 3 and facts.jump_safe
    # A rule doubled 40 times: finite, but its forced text would be 2**40 bytes.
    doubling = ['a0 ::= "x"'] + [f"a{i} ::= a{i - 1} a{i - 1}" for i in range(1, 41)] + ["root ::= a40"]
    facts = analyze(str(xgr.Grammar.from_ebnf("\n".join(doubling))))
    assert facts is not None and facts.shortest == 2**40 > MAX_FORCED and not facts.jump_safe
    # Rule names keep the dots and dashes of definition names (`definitions_A.b-c`).
    node = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/definitions/A.b-c"}},
    }
    dotted = {"$ref": "#/definitions/A.b-c", "definitions": {"A.b-c": node}}
    assert "A.b-c ::=" in schema_ebnf(dotted)
    facts = analyze(schema_ebnf(dotted))
    assert facts is not None and facts.jump_safe
    assert analyze("root ::= Unknown(1)") is None and analyze("not a grammar") is None


@pytest.mark.parametrize(
    "spec",
    [
        SamplingParams(json_schema=RECURSIVE).grammar,
        SamplingParams(json_schema=IN_ARRAY).grammar,
        GrammarSpec("ebnf", 'root ::= "a" root'),
    ],
    ids=["required-next", "required-in-array", "ebnf"],
)
def test_no_finite_output_fails_at_compile(backend: xb.XGrammarBackend, spec: GrammarSpec) -> None:
    with pytest.raises(ValueError, match=f"^{spec.kind}: the grammar admits no finite output"):
        backend.compile(spec)


def test_jump_forward_only_where_the_search_ends(backend: xb.XGrammarBackend, tokenizer: Any) -> None:
    unsafe = backend.compile(SamplingParams(json_schema=UNDER_ANYOF).grammar)  # type: ignore[arg-type]
    assert not unsafe.jump_safe
    m = backend.matcher(unsafe)
    t0 = time.perf_counter()
    assert m.forced_string() == ""
    for t in tokenizer.encode('{"a": {"next": ', add_special_tokens=False):  # the endless branch
        assert m.accept_token(t)
        assert m.forced_string() == ""  # xgrammar's search would never return here
    assert time.perf_counter() - t0 < 5
    linked = backend.compile(SamplingParams(json_schema=LINKED).grammar)  # type: ignore[arg-type]
    assert linked.jump_safe and backend.matcher(linked).forced_string() == '{"v": '


class _SlowSearch:
    """Stands in for xgrammar's matcher: each forced-string search takes 60 ms."""

    calls = 0

    def find_jump_forward_string(self) -> str:
        self.calls += 1
        time.sleep(xb.JUMP_BUDGET_S + 0.01)
        return "x" * (xb.MAX_FORCED_CHARS + 10)


def test_one_slow_search_ends_jump_forward_for_its_matcher(backend: xb.XGrammarBackend) -> None:
    m = backend.matcher(backend.compile(GrammarSpec("regex", "x+")))
    slow = _SlowSearch()
    m._m = slow  # type: ignore[assignment]
    assert m.forced_string() == "x" * xb.MAX_FORCED_CHARS  # capped, and the last search made
    assert m.forced_string() == "" and m.forced_string() == ""
    assert slow.calls == 1
