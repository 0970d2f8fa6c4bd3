"""A tool-use agent: the model picks an action with `select`, Python runs the tool.

    python examples/lang_agent.py

Control flow is plain Python between calls: reading `s["action_0"]` waits
for the select to finish, then the program decides what to append next.
Each step re-reads the whole conversation, which the radix cache holds, so
only the new tokens are computed.
"""

from __future__ import annotations

import re
from typing import Any

import radixserve.lang as sgl


def calculate(expression: str) -> str:
    """The tool: arithmetic only (anything else is an error the model sees)."""
    if not re.fullmatch(r"[0-9+\-*/ ().]+", expression):
        return "error: not an arithmetic expression"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # digits and operators only
    except Exception as e:
        return f"error: {type(e).__name__}"


@sgl.function
def agent(s: Any, question: str, max_steps: int = 3) -> None:
    s += "You can use calculate(expression) to compute, then finish with the answer.\n"
    s += "Question: What is 3 times 4?\nAction: calculate(3*4)\nObservation: 12\n"
    s += "Action: finish\nAnswer: 12\n\n"
    s += "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Action: " + sgl.select(f"action_{step}", ["calculate", "finish"])
        if s[f"action_{step}"] == "finish":
            break
        s += "(" + sgl.gen(f"expression_{step}", max_tokens=12, stop=")") + ")\n"
        s += "Observation: " + calculate(s[f"expression_{step}"]) + "\n"
    s += "\nAnswer:" + sgl.gen("answer", max_tokens=8, stop="\n")


def main(backend: Any = None, question: str = "What is 17 times 23?") -> Any:
    st = agent.run(question=question, backend=backend, temperature=0)
    print(st.text())
    return st


if __name__ == "__main__":
    main()
