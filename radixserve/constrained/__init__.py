"""Structured output: grammars behind a small interface (xgrammar implements it).

It imports nothing else of radixserve: the engine's side is `grammar_compiler.py`, the
worker's grammar steps are `sched/grammar.py`.

- `spec.py`: the constraint of a request in canonical text (from SamplingParams).
- `base.py`: the two interfaces, per engine (`GrammarBackend`) and per request (`Matcher`).
- `xgrammar_backend.py`: xgrammar's implementation, with the tokenizer info fixed up.
- `limits.py`: per-request input limits (`GrammarLimits`), `regex_features.py`: refused regex features.
- `grammar_analysis.py`: shortest outputs of a grammar's rules (no finite output, jump-forward safety).
- `cache.py`: compiles on `executor.py`'s threads, LRU of grammars and failures bounded in bytes.
"""
