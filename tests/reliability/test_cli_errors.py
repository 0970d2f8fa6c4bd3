"""The command line's rough edges (issue 8, item 12): --version, one error prefix, a closed pipe,
a device the machine lacks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import radixserve
from radixserve.cli import main

pytestmark = pytest.mark.timeout(300)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"radixserve {radixserve.__version__}"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["generate"], "generate: the following arguments are required: prompt"),
        (["chat", "--dtype", "float8"], "chat: argument --dtype"),
        (["bogus"], "argument command: invalid choice"),
    ],
)
def test_usage_errors_have_one_prefix(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("radixserve: error:") == 1 and "error: radixserve" not in err, err
    assert err.startswith("radixserve: error: ") and says in err, err


def test_a_missing_cuda_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["generate", "hi", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "device='cuda'" in err and "Assertion" not in err and "\n" not in err.rstrip("\n"), err


def test_a_closed_pipe_ends_quietly() -> None:
    """`radixserve generate ... | head -c 1`: the reader leaves; exit 0, nothing on stderr."""
    cmd = [sys.executable, "-m", "radixserve", "generate", "Count from one to a hundred:"]
    cmd += ["--device", "cpu", "--temperature", "0", "--max-tokens", "300"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1)  # the first streamed byte
    proc.stdout.close()
    rc = proc.wait(timeout=240)
    err = proc.stderr.read().decode()
    assert rc == 0 and "Error" not in err and "Exception" not in err, (rc, err)
