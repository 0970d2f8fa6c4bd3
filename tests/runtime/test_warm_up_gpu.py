"""On a GPU with an empty FlashInfer workspace: start() builds every module the engine's steps run,
so serving requests of mixed lengths (prefill chunks beside decode rows) compiles nothing
more. Each case runs benchmarks/cold_start.py in a child process, since FlashInfer reads
FLASHINFER_WORKSPACE_BASE when imported. Modules that the install ships precompiled
(scripts/gpu_env.sh) load instead of compiling; the check holds either way."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None,
        reason="needs a CUDA device and flashinfer",
    ),
]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cold_start.py"


def _tiny_llama(folder: Path) -> None:
    """A random tiny Llama with FlashInfer's head size (128) and a GQA group of 4 (the
    tensor-core decode path), saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


@pytest.mark.parametrize("decode_kernel", ("auto", "flashinfer"))
def test_start_builds_every_module_the_requests_need(tmp_path: Path, decode_kernel: str) -> None:
    model = tmp_path / "tiny-llama"
    _tiny_llama(model)
    workspace = tmp_path / "fi"
    workspace.mkdir()
    argv = [sys.executable, str(SCRIPT), "--model", str(model), "--attention-backend", "flashinfer"]
    # Mixed lengths: prompts of 8..600 tokens, prefill chunks beside decode rows, W1's draw.
    argv += ["--decode-kernel", decode_kernel, "--requests", "24", "--lo", "8", "--hi", "600"]
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(workspace)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["workspace"] == str(workspace / ".cache" / "flashinfer")
    assert out["files_by_burst"] == [], out["files_by_burst"]  # nothing compiled after start()
    labels = [line.split(": ", 2)[-1] for line in out["progress"]]
    prefill = "flashinfer batch_prefill (fa2) bf16 head_dim 128"
    assert any(label.startswith(prefill) for label in labels), out["progress"]
    assert any("flashinfer norm bf16" in line for line in out["progress"]), out["progress"]
    assert out["progress"][-1].startswith("radixserve: kernels ready ("), out["progress"]
    # A module not shipped precompiled was compiled by start() into the empty workspace.
    if out["aot_modules"] == 0:
        assert any(f.endswith(".so") for f in out["files_by_start"]), out["files_by_start"]
