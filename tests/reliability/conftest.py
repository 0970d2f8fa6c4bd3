"""Fixtures of the reliability suite: the embedded model's engine, tokenizer and transformers twin.

The tokenizer and transformers model come from tests/engine/conftest.py (pytest puts tests/
on sys.path for both packages), so the whole session loads each once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine.conftest import engine_config, hf_greedy, hf_model, tokenizer  # noqa: F401

from radixserve import Engine


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """One blocking engine per module (its own event loop thread); intact at the end."""
    eng = Engine(engine_config())
    yield eng
    assert eng.healthy
    eng.check_integrity()
    eng.close()
