"""Async programs (asyncio.gather, arun from any loop) and streaming (whole program, one fork)."""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import pytest

import radixserve.lang as sgl
from radixserve import Engine


@sgl.function
def qa(s: Any, question: str) -> None:
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


QUESTIONS = ["What is 1+1?", "Name a fruit.", "Say hello."]


def test_gather_aruns_from_another_loop_equal_run(eng: Engine) -> None:
    async def main() -> list[Any]:  # asyncio.run: a loop of its own; calls hop to the engine's
        return list(await asyncio.gather(*(qa.arun(question=q, temperature=0) for q in QUESTIONS)))

    states = asyncio.run(main())
    assert [st["answer"] for st in states] == [qa.run(question=q, temperature=0)["answer"] for q in QUESTIONS]


def test_arun_in_the_engines_loop_awaits_it_directly(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> list[Any]:
        def no_hops(*a: Any, **k: Any) -> Any:
            raise AssertionError("arun in the engine's loop must not hop threads to reach it")

        monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", no_hops)
        try:
            return list(await asyncio.gather(*(qa.arun(question=q, temperature=0) for q in QUESTIONS)))
        finally:
            monkeypatch.undo()

    states = eng.run(main())  # main runs on the engine's event loop
    assert [len(st.messages()) for st in states] == [2, 2, 2]
    assert [st["answer"] for st in states] == [qa.run(question=q, temperature=0)["answer"] for q in QUESTIONS]


def test_stream_the_whole_program_and_one_variable(eng: Engine) -> None:
    st = qa.run(question="Tell me about cats.", stream=True, temperature=0)
    pieces = list(st.text_iter())
    assert len(pieces) > 3 and "".join(pieces) == st.text()
    st2 = qa.run(question="Tell me about cats.", stream=True, temperature=0)
    var_pieces = list(st2.text_iter("answer"))
    assert len(var_pieces) > 1 and "".join(var_pieces) == st2["answer"] == st["answer"]
    assert st2.error() is None


def test_stream_one_fork(eng: Engine) -> None:
    handed: queue.Queue[Any] = queue.Queue()

    @sgl.function
    def tips(s: Any) -> None:
        s += "Two tips for writing:\n"
        forks = s.fork(2)
        handed.put(forks[0])
        forks += lambda i: f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=8)
        forks.join()

    st = tips.run(stream=True, temperature=0)
    branch = handed.get(timeout=60)
    pieces = list(branch.text_iter("tip"))
    assert len(pieces) > 1 and "".join(pieces) == branch["tip"]
    assert st["tip"][0] == branch["tip"] and len(st["tip"]) == 2


def test_async_iteration_of_a_streaming_program(eng: Engine) -> None:
    async def main() -> tuple[str, str]:
        st = await qa.arun(question="Describe the sea.", stream=True, temperature=0)
        out = ""
        async for chunk in st:
            out += chunk
        var = ""
        st2 = await qa.arun(question="Describe the sea.", stream=True, temperature=0)
        async for chunk in st2.text_async_iter("answer"):
            var += chunk
        assert st2["answer"] == var
        return out, st.text()

    out, text = asyncio.run(main())
    assert out == text


def test_async_stream_with_meta_data_as_sglang_yields_it(eng: Engine) -> None:
    """text_async_iter(name, return_meta_data=True): (piece, meta_info) pairs whose logprobs
    are the piece's tokens, with the running counts; they add up to the final meta_info."""

    @sgl.function
    def told(s: Any) -> None:
        s += sgl.user("Describe the sea.")
        s += sgl.assistant(sgl.gen("answer", max_tokens=12, return_logprob=True, top_logprobs_num=2))

    async def main() -> tuple[list[tuple[str, dict[str, Any]]], Any]:
        st = await told.arun(stream=True, temperature=0)
        pairs = [pair async for pair in st.text_async_iter("answer", return_meta_data=True)]
        await st.finished()
        with pytest.raises(ValueError, match="needs a variable name"):
            async for _ in st.text_async_iter(return_meta_data=True):
                pass
        return pairs, st

    pairs, st = asyncio.run(main())
    final = st.get_meta_info("answer")
    assert len(pairs) > 1 and "".join(p for p, _ in pairs) == st["answer"]
    sent = 0
    for piece, meta in pairs:
        assert piece and meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - sent
        assert len(meta["output_top_logprobs"]) == len(meta["output_token_logprobs"])
        sent = meta["completion_tokens"]
    assert [lp for _, m in pairs for lp in m["output_token_logprobs"]] == final["output_token_logprobs"]
    assert sent == final["completion_tokens"] == 12
    # Without streaming the variable comes whole, with its meta_info.
    plain = told.run(temperature=0)
    assert asyncio.run(_collect(plain)) == [(st["answer"], plain.get_meta_info("answer"))]


async def _collect(st: Any) -> list[Any]:
    return [pair async for pair in st.text_async_iter("answer", return_meta_data=True)]


def test_async_run_batch_with_progress(eng: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> list[Any]:
        return await qa.arun_batch([{"question": q} for q in QUESTIONS], temperature=0, progress_bar=True)

    states = asyncio.run(main())
    assert "3/3" in capsys.readouterr().err
    assert [st.error() for st in states] == [None, None, None]
