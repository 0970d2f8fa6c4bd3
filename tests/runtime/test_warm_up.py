"""Kernels are built at start-up (runtime/warm_up.py): `run_builds`' progress lines and errors,
the engine's start running the backend's builds once before it serves (torch backend, and the
Triton backend under the interpreter, in a subprocess), and a failed build failing `start()`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.runtime.attention.torch_backend import TorchAttention
from radixserve.runtime.runner import ModelRunner
from radixserve.runtime.warm_up import KernelBuild, KernelBuildError, run_builds

LOGGER = "radixserve.runtime.warm_up"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A config-only tiny Llama: random weights (load_format="dummy")."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    ).save_pretrained(folder)
    return str(folder)


def _progress(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_run_builds_runs_each_once_in_order_with_a_line_each(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    def build(label: str) -> KernelBuild:
        return KernelBuild(label, lambda: ran.append(label))

    caplog.set_level(logging.INFO, logger=LOGGER)
    import torch

    run_builds([build("a"), build("b"), build("a")], torch.device("cpu"))  # "a" again: skipped
    assert ran == ["a", "b"]
    lines = _progress(caplog)
    assert lines[0].startswith("radixserve: compiling kernels (1/2: a)... ") and lines[0].endswith(" s")
    assert lines[1].startswith("radixserve: compiling kernels (2/2: b)... ")
    assert lines[2].startswith("radixserve: kernels ready (2 built or loaded in ")


def test_a_failing_build_raises_naming_it() -> None:
    import torch

    def broken() -> None:
        raise ValueError("nvcc exited with 1")

    builds = [KernelBuild("fine", lambda: None), KernelBuild("batch_prefill bf16 head_dim 128", broken)]
    with pytest.raises(
        KernelBuildError, match=r"\(2/2: batch_prefill bf16 head_dim 128\) failed: ValueError: nvcc"
    ):
        run_builds(builds, torch.device("cpu"))


def _probe_builds(monkeypatch: pytest.MonkeyPatch, run: Callable[[], None]) -> list[int]:
    """The torch backend given one extra build, `run`; the runner's warm-ups recorded (its step
    count at each call)."""
    original = TorchAttention.kernel_builds
    monkeypatch.setattr(
        TorchAttention,
        "kernel_builds",
        lambda self, cascade: [*original(self, cascade), KernelBuild("probe kernel", run)],
    )
    calls: list[int] = []
    warm_up = ModelRunner.warm_up

    def recording(self: ModelRunner, builds: list[KernelBuild]) -> float:
        calls.append(self.launches)
        return warm_up(self, builds)

    monkeypatch.setattr(ModelRunner, "warm_up", recording)
    return calls


def test_start_warms_the_backend_up_once_before_serving(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    built: list[str] = []
    calls = _probe_builds(monkeypatch, lambda: built.append("probe"))
    caplog.set_level(logging.INFO, logger=LOGGER)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    async def main() -> list[int]:
        engine = AsyncEngine(EngineConfig(model=tiny_model, load_format="dummy", attention_backend="torch"))
        await engine.start()
        assert built == ["probe"] and calls == [0]  # done within start(), before any step ran
        try:
            out = await asyncio.gather(*(engine.complete(list(range(1, n)), params) for n in (3, 20, 9)))
        finally:
            await engine.shutdown()
        return [len(o.token_ids) for o in out]  # type: ignore[union-attr]

    assert asyncio.run(main()) == [3, 3, 3]
    assert built == ["probe"] and calls == [0]  # serving built nothing more
    lines = _progress(caplog)
    assert lines[0].startswith("radixserve: compiling kernels (1/1: probe kernel)... ")
    assert lines[1].startswith("radixserve: kernels ready (1 built or loaded in ")


@pytest.mark.timeout(120)
def test_a_failed_build_fails_start_with_its_name(tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("ninja: build stopped: subcommand failed")

    _probe_builds(monkeypatch, broken)

    async def main() -> None:
        engine = AsyncEngine(EngineConfig(model=tiny_model, load_format="dummy", attention_backend="torch"))
        with pytest.raises(KernelBuildError, match=r"\(1/1: probe kernel\) failed: RuntimeError: ninja"):
            await engine.start()
        assert not engine.healthy
        with pytest.raises(RuntimeError, match="not running"):  # refused at once, not left waiting
            await engine.complete([1, 2, 3], SamplingParams(max_tokens=2))

    asyncio.run(main())


def test_triton_start_builds_its_kernels_under_the_interpreter(tiny_model: str) -> None:
    pytest.importorskip("triton")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "warm_up_case.py"), tiny_model],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = out["lines"]
    labels = [
        "triton extend fp32 head_dim 16",
        "triton decode fp32 head_dim 16",
        "triton cascade fp32 head_dim 16",
    ]
    assert len(lines) == 4
    for i, (line, label) in enumerate(zip(lines, labels), 1):
        assert line.startswith(f"radixserve: compiling kernels ({i}/3: {label})... ")
    assert lines[3].startswith("radixserve: kernels ready (3 built or loaded in ")
    assert [len(t) for t in out["tokens"]] == [3, 3, 3]
    # A windowed model on "flashinfer" runs Triton's halves: the extend half's extend kernels and
    # the decode half's decode kernels, per layer variant; no cascade (windows rule it out).
    assert out["hybrid"] == [
        ["triton extend fp32 head_dim 16 (window 8)", "extend"],
        ["triton extend fp32 head_dim 16", "extend"],
        ["triton decode fp32 head_dim 16 (window 8)", "decode"],
        ["triton decode fp32 head_dim 16", "decode"],
    ]
