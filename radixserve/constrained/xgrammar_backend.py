"""xgrammar behind `GrammarBackend` / `Matcher`.

The tokenizer info is built with the model's vocabulary size (the LM head's
rows): ids past the tokenizer's vocabulary are never allowed. Special tokens
(`<|im_start|>`, `<|endoftext|>`, ...) are never allowed inside a grammar:
xgrammar only treats a token as special when its text is empty, and for some
tokenizers (the embedded SmolLM2 among them) it finds none, so a JSON string
could contain `<|im_start|>`. Their texts are blanked before the info is
built; the stop tokens (the model's EOS ids) stay allowed exactly where the
grammar can end.

JSON schemas compile without free whitespace (`any_whitespace=False`, the
separators of `json.dumps`: ", " and ": "): a small model otherwise tends to
emit whitespace until max_tokens runs out, and fixed separators are forced
strings that jump-forward skips. Schemas go through `json_schema.prepare`
first (strict-mode arrays, allOf, multipleOf; see there).

Every grammar is built as an `xgr.Grammar` and read by `grammar_analysis`
before it compiles: one with no finite output fails its request here, and
`Compiled.jump_safe` says whether xgrammar's jump-forward search is bounded on
it (it loops forever, holding the GIL, inside a rule with no finite
derivation). Matchers of other grammars never search, and a matcher whose
search once took longer than `JUMP_BUDGET_S` stops searching (forced text is
then found token by token through the masks, as with `jump_forward=False`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

from radixserve.constrained.grammar_analysis import analyze
from radixserve.constrained.json_schema import prepare
from radixserve.constrained.regex_rewrite import optional_groups
from radixserve.constrained.spec import GrammarSpec

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")  # "[08:34:09] /project/cpp/x.cc:94: "
JUMP_BUDGET_S = 0.05  # one forced-string search slower than this ends jump-forward for its matcher
MAX_FORCED_CHARS = 4096  # forced text taken at once (the rest is forced again after it)
NO_OUTPUT = (
    "the grammar admits no finite output: every output recurses without end (e.g. an object "
    "that requires a property of its own type); make the recursion optional"
)


@dataclass(frozen=True)
class Compiled:
    """A compiled grammar and what the analysis found out about it."""

    grammar: xgr.CompiledGrammar
    jump_safe: bool  # xgrammar's forced-string search ends on every state of this grammar

    @property
    def size_bytes(self) -> int:
        return int(self.grammar.memory_size_bytes)


def special_token_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(i))
    return ids


def tokenizer_info(
    tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], never: Iterable[int] = ()
) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary; special tokens and `never` are never allowed."""
    stops = sorted(stop_ids)
    detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
    encoded = [""] * vocab_size
    for text, i in tokenizer.get_vocab().items():
        if i < vocab_size:
            encoded[i] = text
    for i in (special_token_ids(tokenizer) | set(never)) - set(stops):
        if i < vocab_size:
            encoded[i] = ""  # xgrammar's mark of a special token: never inside a grammar
    return xgr.TokenizerInfo(
        encoded,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stops,
        add_prefix_space=detected.add_prefix_space,
    )


def choice_grammar(choices: list[str]) -> str:

    # JSON string escapes are valid EBNF string literals in xgrammar.
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def clean_error(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return _LOG_PREFIX.sub("", lines[0] if lines else type(e).__name__)


class XGrammarMatcher:
    def __init__(self, compiled: Compiled, vocab_size: int) -> None:
        self._m = xgr.GrammarMatcher(compiled.grammar)
        self._vocab_size = vocab_size
        self._jump = compiled.jump_safe  # off for good after one slow search

    def accept_token(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._m.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def forced_string(self) -> str:
        if not self._jump:
            return ""
        t0 = time.perf_counter()
        forced = str(self._m.find_jump_forward_string())
        if time.perf_counter() - t0 > JUMP_BUDGET_S:
            self._jump = False
        return forced[:MAX_FORCED_CHARS]

    def forced_stop(self) -> int | None:
        if not self._m.is_completed():  # cheap test first: a row fill only at the grammar's end
            return None
        mask = xgr.allocate_token_bitmask(1, self._vocab_size)
        self._m.fill_next_token_bitmask(mask, 0)
        row = mask[0]
        words = torch.nonzero(row).flatten()
        if len(words) != 1:
            return None
        w = int(row[words[0]]) & 0xFFFFFFFF
        if w & (w - 1):  # more than one token in the word
            return None
        tok = int(words[0]) * 32 + w.bit_length() - 1
        return tok if tok in self._m.stop_token_ids else None


class XGrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], threads: int = 2) -> None:
        """`tokenizer`: a transformers tokenizer (xgrammar reads it)."""
        self.vocab_size = vocab_size
        self.info = tokenizer_info(tokenizer, vocab_size, stop_ids)
        # Our GrammarCache is the (bounded) cache: xgrammar's own would grow without limit.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        # JSON text never holds a raw control character (inside strings they are escaped;
        # between values we write only spaces), but xgrammar's length-bounded string rule
        # lets them through: JSON schemas compile against a vocabulary without those tokens.
        control = [i for i, b in enumerate(self.info.decoded_vocab) if any(c < 0x20 for c in b)]
        self.json_info = tokenizer_info(tokenizer, vocab_size, stop_ids, never=control)
        self.json_compiler = xgr.GrammarCompiler(self.json_info, max_threads=threads, cache_enabled=False)
        self._batch = xgr.BatchGrammarMatcher("auto")  # fills a step's rows on several threads

    def compile(self, spec: GrammarSpec) -> Compiled:
        try:
            grammar = self._grammar(spec)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"{spec.kind}: {clean_error(e)}") from None
        facts = analyze(str(grammar))
        if facts is not None and not facts.admits_output:
            raise ValueError(f"{spec.kind}: {NO_OUTPUT}")
        compiler = self.json_compiler if spec.kind == "json_schema" else self.compiler
        try:
            compiled = compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"{spec.kind}: {clean_error(e)}") from None
        return Compiled(compiled, facts is not None and facts.jump_safe)

    def _grammar(self, spec: GrammarSpec) -> xgr.Grammar:
        if spec.kind == "json_schema":
            schema = json.dumps(prepare(json.loads(spec.text)))
            return xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=(", ", ": "))
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(optional_groups(spec.text))
        if spec.kind == "ebnf":
            return xgr.Grammar.from_ebnf(spec.text)
        if spec.kind == "choice":
            return xgr.Grammar.from_ebnf(choice_grammar(json.loads(spec.text)))
        if spec.kind == "structural_tag":
            return xgr.Grammar.from_structural_tag(spec.text)
        raise ValueError(f"unknown grammar kind {spec.kind!r}")

    def matcher(self, compiled: Any) -> XGrammarMatcher:
        return XGrammarMatcher(compiled, self.vocab_size)

    def memory_bytes(self, compiled: Any) -> int:
        return int(compiled.size_bytes)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill_bitmasks(self, matchers: list[Any], bitmask: torch.Tensor, rows: list[int]) -> None:
        if len(matchers) == 1:
            matchers[0].fill_bitmask(bitmask, rows[0])
            return
        self._batch.batch_fill_next_token_bitmask([m._m for m in matchers], bitmask, rows)
