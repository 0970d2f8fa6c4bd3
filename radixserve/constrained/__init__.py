"""Structured output: grammars behind a small interface (xgrammar implements it).

- `spec.py`: the constraint of a request in canonical text (from SamplingParams).
- `base.py`: the two interfaces, per engine (`GrammarBackend`) and per request (`Matcher`).
- `xgrammar_backend.py`: xgrammar's implementation, with the tokenizer info fixed up.
- `cache.py`: compiles off the worker thread, bounded LRU of grammars and failures.
- `bitmask.py`: fills a step's bitmask rows; `jump_forward.py`: the forced strings.
"""
