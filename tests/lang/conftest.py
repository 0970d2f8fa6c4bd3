"""One embedded engine for all frontend-language tests (the default backend while they run)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import radixserve.lang as sgl
from radixserve import Engine

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    eng = Engine(model=MODEL, device="cpu", dtype="float32")
    sgl.set_default_backend(eng)
    try:
        yield eng
    finally:
        sgl.set_default_backend(None)
        eng.check_integrity()
        eng.close()


@pytest.fixture()
def eng(engine: Engine) -> Iterator[Engine]:
    """The shared engine, checked after each test: every KV slot free or cached."""
    yield engine
    engine.check_integrity()
    assert engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0


@pytest.fixture(scope="session")
def tokenizer(engine: Engine) -> Any:
    return engine.tokenizer
