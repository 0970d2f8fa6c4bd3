"""Lifecycle (issue 8, items 2, 3, 4, 5, 9): start, shutdown, loops, reused ids, leaving the loop.

Every wait is bounded (asyncio.wait_for, the module's pytest timeout): a hang fails the test.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, Engine, EngineDeadError, SamplingParams
from radixserve.errors import EngineClosedError
from radixserve.testing import inject_faults

from .conftest import engine_config, hf_greedy

pytestmark = pytest.mark.timeout(300)

LONG = SamplingParams(max_tokens=400, ignore_eos=True)
T = 60  # seconds any single wait may take


def _workers() -> int:
    return sum(t.name == "radixserve-worker" for t in threading.enumerate())


async def _idle(eng: AsyncEngine) -> dict[str, Any]:
    for _ in range(500):  # aborts land on the worker within a step or two
        s = await eng.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return s
        await asyncio.sleep(0.01)
    raise AssertionError(f"requests still running: {s}")


async def _first_output(agen: Any) -> Any:
    return await asyncio.wait_for(agen.__anext__(), T)


def test_async_lifecycle(tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("The rain in Spain")
    ref = hf_greedy(hf_model, ids, 8)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    async def main() -> None:
        eng = AsyncEngine(engine_config())
        assert eng.loop is None
        before = _workers()
        # item 5: concurrent starts share one build
        await asyncio.wait_for(asyncio.gather(eng.start(), eng.start()), 120)
        assert _workers() == before + 1 and eng.loop is asyncio.get_running_loop()
        pending: list[asyncio.Task[Any]] = []
        with pytest.raises(KeyError, match="boom"):
            async with eng:  # already started: the same engine
                assert _workers() == before + 1
                await _reused_request_id(eng, ids, ref, greedy)
                await _leaving_the_loop(eng, ids)
                await _generate_many_fails_as_a_whole(eng, ids)
                await eng.check_integrity()
                # item 2: a body that raises shuts down without draining; nobody hangs
                pending.append(asyncio.create_task(eng.complete(ids, LONG)))
                stream = eng.generate(ids, LONG)
                await _first_output(stream)
                pending.append(asyncio.create_task(_drain(stream)))
                await asyncio.sleep(0.05)
                raise KeyError("boom")
        results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), T)
        assert all(isinstance(r, EngineClosedError) for r in results), results
        assert _workers() == before and not eng.healthy
        with pytest.raises(RuntimeError, match="not running"):
            await asyncio.wait_for(eng.complete(ids, greedy), 5)
        with pytest.raises(RuntimeError, match="not running"):
            await asyncio.wait_for(eng.stats(), 5)

    asyncio.run(main())


async def _drain(agen: Any) -> None:
    async for _ in agen:
        pass


async def _reused_request_id(eng: AsyncEngine, ids: list[int], ref: list[int], greedy: Any) -> None:
    """item 3: a new request may reuse the id of a cancelled one and gets only its own output."""
    for _ in range(3):
        task = asyncio.create_task(_drain(eng.generate(ids, LONG, request_id="r1")))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await asyncio.wait_for(eng.complete(ids, greedy, request_id="r1"), T)
        assert out.request_id == "r1" and out.finish_reason == "length" and list(out.token_ids) == ref
    # ids still in use are refused; abort(id) reaches the live request of that id
    stream = eng.generate(ids, LONG, request_id="r2")
    first = await _first_output(stream)
    assert first.request_id == "r2"
    with pytest.raises(ValueError, match="already running"):
        await eng.complete(ids, greedy, request_id="r2")
    await eng.abort("r2")
    outs = [o async for o in stream]
    assert outs[-1].finish_reason == "abort" and outs[-1].request_id == "r2"
    await _idle(eng)


async def _leaving_the_loop(eng: AsyncEngine, ids: list[int]) -> None:
    """item 9, as documented: a held generator keeps its request until it is closed or dropped."""
    agen = eng.generate(ids, LONG)
    async for _ in agen:
        break
    assert (await eng.stats())["running"] == 1  # still referenced: still running
    await agen.aclose()
    await _idle(eng)
    async for _ in eng.generate(ids, LONG):  # nobody holds it: aborted on collection
        break
    await _idle(eng)


async def _generate_many_fails_as_a_whole(eng: AsyncEngine, ids: list[int]) -> None:
    """item 9: one invalid prompt raises, and the valid requests of the call do not run on."""
    with pytest.raises(ValueError, match="token ids"):
        await asyncio.wait_for(eng.generate_many([ids, ids, [10**9]], LONG), T)
    with pytest.raises(TypeError, match="prompt"):
        await asyncio.wait_for(eng.generate_many([ids, None], LONG), T)  # type: ignore[list-item]
    await _idle(eng)


def test_shutdown_without_drain_then_restart_and_a_failing_forward(tokenizer: Any) -> None:
    ids = tokenizer.encode("Tell me about")

    async def main() -> None:
        eng = AsyncEngine(engine_config())
        await eng.start()
        tasks = [asyncio.create_task(eng.complete(ids, LONG)) for _ in range(2)]
        stream = eng.generate(ids, LONG)
        await _first_output(stream)
        tasks.append(asyncio.create_task(_drain(stream)))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(eng.shutdown(drain=False), T)  # item 2
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), T)
        assert all(isinstance(r, EngineClosedError) for r in results), results
        # a shut-down engine starts again; then the forward of step 3 raises, as a failing device would
        await eng.start()
        assert eng.healthy

        def fail_at_3(step: int, logits: torch.Tensor, sampling: Any) -> torch.Tensor:
            if step >= 3:
                raise RuntimeError("injected device fault")
            return logits

        inject_faults(eng, fail_at_3)
        tasks = [asyncio.create_task(eng.complete(ids, LONG)) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), T)
        assert all(isinstance(r, EngineDeadError) and "injected device fault" in str(r) for r in results)
        assert not eng.healthy
        with pytest.raises(EngineDeadError):  # at once, not after a wait
            await asyncio.wait_for(eng.complete(ids, LONG), 5)
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(eng.stats(), 5)
        await asyncio.wait_for(eng.shutdown(), T)

    asyncio.run(main())


def test_blocking_close_resolves_waiters_and_later_calls_raise(tokenizer: Any) -> None:
    ids = tokenizer.encode("Once more")
    eng = Engine(engine_config())
    result: list[BaseException | Any] = []

    def waiter() -> None:
        try:
            result.append(eng.complete(ids, LONG))
        except BaseException as e:  # noqa: BLE001 - what the caller sees
            result.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    for _ in range(5000):
        if eng.stats()["running"]:
            break
    assert eng.stats()["running"] == 1
    eng.close()
    t.join(T)
    assert not t.is_alive() and isinstance(result[0], EngineClosedError)
    for call in (lambda: eng.complete(ids, LONG), eng.stats, lambda: list(eng.generate(ids, LONG))):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    eng.close()  # twice is fine


def test_an_engine_belongs_to_its_loop(engine: Engine, tokenizer: Any) -> None:
    """item 4: another loop gets a clear RuntimeError at once; the engine serves on."""
    ids = tokenizer.encode("Hello")
    async_engine = engine.engine
    with pytest.raises(RuntimeError, match=r"engine.loop.*run_coroutine_threadsafe"):
        asyncio.run(asyncio.wait_for(async_engine.complete(ids, SamplingParams(max_tokens=2)), 5))

    async def stream_elsewhere() -> None:
        async for _ in async_engine.generate(ids, SamplingParams(max_tokens=2)):
            pass

    with pytest.raises(RuntimeError, match="engine.loop"):
        asyncio.run(asyncio.wait_for(stream_elsewhere(), 5))
    with pytest.raises(RuntimeError, match="engine.loop"):
        asyncio.run(asyncio.wait_for(async_engine.stats(), 5))
    assert engine.healthy
    fut = asyncio.run_coroutine_threadsafe(
        async_engine.complete(ids, SamplingParams(max_tokens=2)), async_engine.loop
    )  # type: ignore[arg-type]
    assert fut.result(T).finished
    assert engine.complete(ids, SamplingParams(max_tokens=2)).finished

    async def blocking_call_inside_the_loop(_: AsyncEngine) -> None:
        engine.stats()  # would deadlock: the loop waiting on itself

    with pytest.raises(RuntimeError, match="own event loop"):
        engine.run(blocking_call_inside_the_loop(async_engine))
    assert engine.healthy


def test_an_engine_whose_loop_closed_stops_instead_of_hanging(tokenizer: Any) -> None:
    """item 4: its loop ended with a request in flight; the next loop is told, and can shut it down."""
    ids = tokenizer.encode("Far away")
    eng = AsyncEngine(engine_config())
    before = _workers()

    async def first() -> None:
        await eng.start()
        asyncio.get_running_loop().create_task(eng.complete(ids, LONG))  # cancelled by asyncio.run
        await asyncio.sleep(0.3)

    asyncio.run(first())

    async def second() -> None:
        assert not eng.healthy
        with pytest.raises(RuntimeError, match="engine.loop"):
            await asyncio.wait_for(eng.complete(ids, LONG), 5)
        await asyncio.wait_for(eng.shutdown(), T)
        assert _workers() == before  # its worker is gone

    asyncio.run(second())


def test_two_engines_start_concurrently_in_a_fresh_process() -> None:
    """item 5: transformers' lazy imports raced when two engines built at once (a fresh interpreter)."""
    code = textwrap.dedent(
        """
        import asyncio
        from radixserve import AsyncEngine, EngineConfig, SamplingParams

        async def main():
            cfg = EngineConfig(device="cpu", dtype="float32", kv_cache_tokens=4096)
            a, b = AsyncEngine(cfg), AsyncEngine(cfg)
            await asyncio.gather(a.start(), b.start())
            p = SamplingParams(temperature=0, max_tokens=3)
            x, y = await asyncio.gather(a.complete("Hi", p), b.complete("Hi", p))
            assert x.token_ids == y.token_ids, (x, y)
            await asyncio.gather(a.shutdown(), b.shutdown())
            print("ok")

        asyncio.run(main())
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_a_failed_start_frees_what_it_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that fails after the weights are loaded (here the kernel warm-up raises, as an
    out-of-memory would) frees them while the caller still holds the exception (a notebook
    keeps the last one for good); the traceback keeps its lines; the same engine then starts."""
    import traceback
    import weakref

    from radixserve import engine_build

    models: list[weakref.ref[torch.nn.Module]] = []
    real_load = engine_build.load_model

    def load(*args: Any, **kwargs: Any) -> Any:
        loaded = real_load(*args, **kwargs)
        models.append(weakref.ref(loaded.model))
        return loaded

    def warm_up(self: Any, builds: Any) -> None:
        raise MemoryError("simulated: no room left for the kernels")

    monkeypatch.setattr(engine_build, "load_model", load)
    monkeypatch.setattr(engine_build.ModelRunner, "warm_up", warm_up)
    eng = AsyncEngine(engine_config())
    with pytest.raises(MemoryError, match="simulated") as err:
        asyncio.run(asyncio.wait_for(eng.start(), T))
    assert len(models) == 1 and models[0]() is None, "the weights outlived the failed start"
    assert "warm_up" in "".join(traceback.format_exception(err.value))
    monkeypatch.undo()

    async def retry() -> list[int]:
        await asyncio.wait_for(eng.start(), T)
        try:
            out = await asyncio.wait_for(eng.complete([1, 2, 3], SamplingParams(max_tokens=4)), T)
            return list(out.token_ids)
        finally:
            await eng.shutdown()

    assert len(asyncio.run(retry())) == 4


def test_the_build_runs_in_a_thread_that_ends_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in asyncio's pool, whose threads stay: on the CPU every live thread that ran torch
    ops keeps an OpenMP team, and teams beyond the cores slowed each step of the worker
    (own_thread.py). After the start, the worker is the only new thread."""
    from radixserve import local_engine

    builders: list[threading.Thread] = []
    real_build = local_engine.build_parts

    def build(*args: Any, **kwargs: Any) -> Any:
        builders.append(threading.current_thread())
        return real_build(*args, **kwargs)

    monkeypatch.setattr(local_engine, "build_parts", build)

    async def main() -> None:
        before = {t.ident for t in threading.enumerate()}
        async with AsyncEngine(engine_config()) as eng:
            await asyncio.wait_for(eng.start(), T)
            added = [t.name for t in threading.enumerate() if t.ident not in before]
            assert added == ["radixserve-worker"], added
            assert len(builders) == 1 and not builders[0].is_alive()
            out = await asyncio.wait_for(eng.complete([1, 2, 3], SamplingParams(max_tokens=2)), T)
            assert len(out.token_ids) == 2

    asyncio.run(main())
