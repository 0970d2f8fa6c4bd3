"""Session-wide fixtures: transformers' twin of the embedded model and its tokenizer, loaded once
for every directory that compares against them (engine, reliability, server, lang)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixserve.model.embedded import embedded_model_dir


@pytest.fixture(scope="session")
def hf_model() -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir())
