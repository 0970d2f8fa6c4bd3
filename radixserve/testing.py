"""pytest plugin: one shared, greedy radixserve engine per model for agent tests.

Installed with radixserve (entry point `pytest11`), or load it by hand with
`pytest -p radixserve.testing`. Sessions that do not ask for an engine load
no model: the engine modules are imported and the model loaded on first use
of a fixture, and every engine is closed when the session ends.

Fixtures
- `radixserve_engine`: a blocking `radixserve.Engine`, loaded once per model
  and shared by the whole session (the fixture itself is function-scoped so it
  can read the test's marker). Its prompts and KV stay in the radix cache, so
  tests that share a system prompt prefill it once.
- `radixserve_params`: greedy `SamplingParams(temperature=0, max_tokens=...)`;
  derive others with `dataclasses.replace(radixserve_params, max_tokens=8)`.
- `radixserve_run`: runs `async def body(engine: AsyncEngine)` on the shared
  engine's own event loop and returns its result. Use it for async agent code
  (concurrency with `asyncio.gather`, streaming with `async for`). Do not call
  `radixserve_engine.engine` from a loop of your own (e.g. inside
  `asyncio.run`): the AsyncEngine belongs to the loop it was started in.
- `openai_client` / `async_openai_client`: an `openai.OpenAI` / `openai.AsyncOpenAI`
  served in process by `create_app` over the shared engine (no port, no subprocess;
  `radixserve.server.inprocess_openai`). Its model is `radixserve_engine.engine.config.model`.
  Use the sync one from the test itself, the async one from `asyncio.run(...)` or
  `radixserve_run` (it works from any loop). Needs the `server` extra and `openai`.
- `radixserve_engines` (session): the pool, `get(model=None, device=None)`,
  for session- or module-scoped fixtures of your own.

Configuration (ini options; a marker overrides them for one test or module)
- `radixserve_model`: embedded name, HF folder, .gguf file or `dummy:<shape>`
  (default: the embedded smollm2-135m-instruct).
- `radixserve_device`: default `cpu` (deterministic, float32: greedy output
  equals transformers').  `radixserve_dtype`: default `auto`.
- `radixserve_max_tokens`: max_tokens of `radixserve_params` (default 64).
- `@pytest.mark.radixserve(model="...", device="...")` on a test, a class or
  `pytestmark` of a module.

Example (examples/test_example_agent.py has a longer one)::

    import asyncio
    import dataclasses

    def test_agent_answers(radixserve_engine, radixserve_params):
        out = radixserve_engine.complete(
            [{"role": "user", "content": "What is the capital of France?"}],
            dataclasses.replace(radixserve_params, max_tokens=16),
        )
        assert "Paris" in out.text

    def test_agents_in_parallel(radixserve_run, radixserve_params):
        async def body(engine):
            outs = await asyncio.gather(*(engine.complete(q, radixserve_params) for q in ("Hi", "Bye")))
            return [o.text for o in outs]

        assert all(radixserve_run(body))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:  # radixserve imports torch: only fixtures that are used import it
    import openai

    from radixserve.blocking import Engine
    from radixserve.engine import AsyncEngine
    from radixserve.runtime.runner import FaultHook
    from radixserve.sampling_params import SamplingParams

T = TypeVar("T")
DEFAULT_MODEL = "smollm2-135m-instruct"
MARKER = "radixserve"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("radixserve_model", "model of the radixserve_engine fixture", default=DEFAULT_MODEL)
    parser.addini("radixserve_device", "device of the radixserve_engine fixture", default="cpu")
    parser.addini("radixserve_dtype", "dtype of the radixserve_engine fixture", default="auto")
    parser.addini("radixserve_max_tokens", "max_tokens of the radixserve_params fixture", default="64")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(model=None, device=None): the model (and device) of the radixserve fixtures "
        "for this test; overrides the radixserve_model / radixserve_device ini options",
    )


class EnginePool:
    """Engines by (model, device), created on first request and closed by `close()`."""

    def __init__(self, model: str, device: str, dtype: str) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self._engines: dict[tuple[str, str], Engine] = {}
        self._failures: dict[tuple[str, str], str] = {}

    def get(self, model: str | None = None, device: str | None = None) -> Engine:
        key = (model or self.model, device or self.device)
        if key not in self._engines and key not in self._failures:
            from radixserve.blocking import Engine
            from radixserve.config import EngineConfig

            try:
                self._engines[key] = Engine(EngineConfig(model=key[0], device=key[1], dtype=self.dtype))
            except Exception as e:  # remembered: every later test fails at once instead of reloading
                self._failures[key] = f"radixserve: cannot start model {key[0]!r} on {key[1]}: {e}"
        if key in self._failures:  # outside `except`: the report is one line, no exception chain
            pytest.fail(self._failures[key], pytrace=False)
        return self._engines[key]

    def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()


@pytest.fixture(scope="session")
def radixserve_engines(pytestconfig: pytest.Config) -> Iterator[EnginePool]:
    pool = EnginePool(
        str(pytestconfig.getini("radixserve_model")),
        str(pytestconfig.getini("radixserve_device")),
        str(pytestconfig.getini("radixserve_dtype")),
    )
    yield pool
    pool.close()


@pytest.fixture
def radixserve_engine(request: pytest.FixtureRequest, radixserve_engines: EnginePool) -> Engine:
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return radixserve_engines.get()
    unknown = set(marker.kwargs) - {"model", "device"}
    if unknown or len(marker.args) > 1:
        pytest.fail(f"@pytest.mark.{MARKER} takes model= and device=, got {marker}", pytrace=False)
    model = marker.kwargs.get("model", marker.args[0] if marker.args else None)
    return radixserve_engines.get(model, marker.kwargs.get("device"))


@pytest.fixture
def radixserve_params(pytestconfig: pytest.Config) -> SamplingParams:
    from radixserve.sampling_params import SamplingParams

    return SamplingParams(temperature=0, max_tokens=int(pytestconfig.getini("radixserve_max_tokens")))


@pytest.fixture
def radixserve_run(radixserve_engine: Engine) -> Callable[[Callable[[AsyncEngine], Awaitable[T]]], T]:
    def run(body: Callable[[AsyncEngine], Awaitable[T]]) -> T:
        # The AsyncEngine lives on the Engine's loop thread; `_run` submits there and waits.
        return radixserve_engine._run(body(radixserve_engine.engine))  # type: ignore[no-any-return]

    return run


@pytest.fixture
def openai_client(radixserve_engine: Engine) -> Iterator[openai.OpenAI]:
    from radixserve.server import create_app, inprocess_openai

    client = inprocess_openai(create_app(radixserve_engine.engine))
    yield client
    client.close()


@pytest.fixture
def async_openai_client(radixserve_engine: Engine) -> Iterator[openai.AsyncOpenAI]:
    from radixserve.server import create_app, inprocess_async_openai

    client = inprocess_async_openai(create_app(radixserve_engine.engine))
    yield client
    asyncio.run(client.close())  # no connections to close: any loop will do


def inject_faults(engine: AsyncEngine | Engine, hook: FaultHook | None) -> None:
    """Test hook: run `hook(step, logits, sampling)` after every forward, on the worker thread.

    `step` counts forwards from 1; `logits` are the step's `[rows, vocab]` (a row
    per request that samples, in `sampling.params` order); the hook returns the
    logits to sample from (e.g. with NaN rows) or raises, as a failing device
    would. `None` removes the hook. For reliability tests of one's own stack.
    """
    from radixserve.blocking import Engine

    eng = engine.engine if isinstance(engine, Engine) else engine  # Engine wraps an AsyncEngine
    worker = eng._worker
    if worker is None:
        raise RuntimeError("inject_faults: start the engine first")
    worker.runner.fault_hook = hook
