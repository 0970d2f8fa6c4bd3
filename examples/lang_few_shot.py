"""A few-shot program run over a batch: the shared examples are computed once.

    python examples/lang_few_shot.py

`run_batch` finds the text every program starts with (the instructions and
the examples), prefills it into the radix cache once, then runs the programs
concurrently; each reports how many of its prompt tokens came from the cache.
"""

from __future__ import annotations

from typing import Any

import radixserve.lang as sgl

EXAMPLES = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Japan", "Tokyo")]


@sgl.function
def capital(s: Any, country: str) -> None:
    s += "Answer with the capital city only.\n"
    for c, a in EXAMPLES:
        s += f"Q: What is the capital of {c}?\nA: {a}\n"
    s += f"Q: What is the capital of {country}?\n"
    s += "A:" + sgl.gen("answer", max_tokens=6, stop="\n")


def main(backend: Any = None, countries: tuple[str, ...] = ("Spain", "Peru", "Canada", "Egypt")) -> list[Any]:
    states = capital.run_batch([{"country": c} for c in countries], backend=backend, temperature=0)
    for c, st in zip(countries, states):
        meta = st.get_meta_info("answer")
        print(f"{c}: {st['answer'].strip()!r} [{meta['cached_tokens']}/{meta['prompt_tokens']} cached]")
    return states


if __name__ == "__main__":
    main()
