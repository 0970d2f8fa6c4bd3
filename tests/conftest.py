"""Session-wide fixtures: one torch thread, and transformers' twin of the embedded model and its
tokenizer, loaded once for every directory that compares against them (engine, reliability,
server, lang, constrained)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixserve.model.embedded import embedded_model_dir


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The tests run many small forwards (the engine's worker and transformers' references in one
    process); with several OpenMP threads on a busy 2-core machine each tiny op waits for a
    descheduled thread (measured 15x slower per decode step in tests/model). One thread keeps
    the run time predictable; both sides of every comparison run under it. Restored afterwards.
    RADIXSERVE_TEST_THREADS=N gives a long opt-in run (the full forced-call run) N threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("RADIXSERVE_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_model() -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir())
