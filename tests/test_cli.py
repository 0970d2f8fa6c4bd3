"""The `radixserve` command: streamed text equals the engine's greedy completion, chat keeps
history (and hits the radix cache), errors are one line and a non-zero exit code."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from radixserve import Engine, EngineConfig, SamplingParams
from radixserve.cli import main

CPU = ["--device", "cpu", "--temperature", "0"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """The reference: what the engine's own `complete()` answers to the same greedy requests."""
    eng = Engine(EngineConfig(device="cpu"))
    yield eng
    eng.close()


def greedy(engine: Engine, prompt: Any, max_tokens: int) -> Any:
    return engine.complete(prompt, SamplingParams(temperature=0, max_tokens=max_tokens))


class Recorder(io.StringIO):
    """A stdout that remembers each write, to see the answer arrive in pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def usage_lines(err: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\w+)", line)) for line in err.splitlines() if line.startswith("[usage]")]


def test_generate_streams_the_greedy_completion(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    question = "Name three planets."
    out = Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["generate", "--chat", question, "--max-tokens", "12", "--usage", *CPU]) == 0
    ref = greedy(engine, [{"role": "user", "content": question}], 12)
    assert out.getvalue() == ref.text + "\n"
    assert len([w for w in out.writes if w]) >= 4  # delta by delta, not the whole text at the end
    [usage] = usage_lines(capsys.readouterr().err)
    assert int(usage["prompt_tokens"]) == ref.usage.prompt_tokens
    assert int(usage["completion_tokens"]) == ref.usage.completion_tokens


def test_chat_keeps_history_until_reset(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    turns = ["Name a fruit.", "And another one?"]
    monkeypatch.setattr(
        sys, "stdin", io.StringIO(f"{turns[0]}\n\n{turns[1]}\n/reset\n{turns[1]}\n/exit\nignored\n")
    )
    assert main(["chat", "--max-tokens", "8", "--usage", *CPU]) == 0
    captured = capsys.readouterr()

    first = greedy(engine, [{"role": "user", "content": turns[0]}], 8)
    history = [
        {"role": "user", "content": turns[0]},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": turns[1]},
    ]
    second = greedy(engine, history, 8)
    fresh = greedy(engine, [{"role": "user", "content": turns[1]}], 8)
    assert captured.out == f"{first.text}\n{second.text}\n{fresh.text}\n"

    u1, u2, u3 = usage_lines(captured.err)
    assert int(u2["prompt_tokens"]) == second.usage.prompt_tokens
    assert int(u2["prompt_tokens"]) > int(u1["prompt_tokens"]) + int(u1["completion_tokens"])
    # The first turn (prompt and answer) is in the radix tree: the second turn's prefill skips it.
    assert int(u2["cached_tokens"]) >= int(u1["prompt_tokens"])
    assert int(u3["prompt_tokens"]) == fresh.usage.prompt_tokens  # /reset forgot the history


def test_python_m_radixserve_reads_the_prompt_from_stdin(engine: Engine) -> None:
    prompt = "The capital of France is"
    proc = subprocess.run(
        [sys.executable, "-m", "radixserve", "generate", "-", "--max-tokens", "5", *CPU],
        input=prompt,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == greedy(engine, prompt, 5).text + "\n"


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["generate", "hi", "--model", "/no/such/model"], 1, "/no/such/model"),
        (["generate", "hi", "--temperature", "-1"], 2, "temperature"),
        (["generate", "hi", "--max-tokens", "many"], 2, "--max-tokens"),
        (["chat", "--dtype", "float8"], 2, "--dtype"),
        (["chat", "--quantization", "int4"], 2, "--quantization"),
        ([], 2, "required"),
    ],
)
def test_errors_are_one_line_and_a_nonzero_exit(
    argv: list[str], code: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    line = captured.err.rstrip("\n")
    assert "\n" not in line and line.startswith("radixserve: error: ") and says in line, captured.err
