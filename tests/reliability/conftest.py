"""Fixtures of the reliability suite: the embedded model's engine (the tokenizer and transformers
twin are the session's, from tests/conftest.py; the helpers come from tests/engine/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine.conftest import engine_config, hf_greedy  # noqa: F401

from radixserve import Engine


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """One blocking engine per module (its own event loop thread); intact at the end."""
    eng = Engine(engine_config())
    yield eng
    assert eng.healthy
    eng.check_integrity()
    eng.close()
