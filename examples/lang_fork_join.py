"""fork/join: several answers from one prompt, then a majority vote (self-consistency).

    python examples/lang_fork_join.py

`s.fork(k)` prefills the shared prompt once, then the k branches run
concurrently and read it from the radix cache; `join()` gathers each
branch's variable into a list in the parent.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import radixserve.lang as sgl


@sgl.function
def vote(s: Any, question: str, k: int = 5) -> None:
    s += "Answer with one word.\nQuestion: " + question + "\n"
    branches = s.fork(k)
    branches += lambda i: f"Answer {i + 1}:" + sgl.gen("answer", max_tokens=4, stop="\n", seed=i)
    branches.join()
    best, _ = Counter(a.strip() for a in s["answer"]).most_common(1)[0]
    s += "Final answer: " + best


def main(backend: Any = None, question: str = "What color is the sky on a clear day?") -> Any:
    st = vote.run(question=question, backend=backend, temperature=0.8)
    print("answers:", st["answer"])
    print(st.text().splitlines()[-1])
    return st


if __name__ == "__main__":
    main()
