"""A failing program (bad parameter, failed request, its own exception) raises from run/arun,
keeps the reason in state.error(), and leaves no request or KV slot behind (the fixture)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import radixserve.lang as sgl
from radixserve import Engine


def test_a_bad_parameter_fails_the_program(eng: Engine) -> None:
    @sgl.function
    def bad(s: Any) -> None:
        s += "Hello" + sgl.gen("x", max_tokens=4)
        s += " and" + sgl.gen("y", temperature=-1.0)
        s += " never" + sgl.gen("z", max_tokens=4)

    with pytest.raises(sgl.ProgramError) as info:
        bad.run()
    st = info.value.state
    assert isinstance(st.error(), ValueError) and "temperature" in str(st.error())
    assert isinstance(st["x"], str) and "y" not in st and "z" not in st


def test_an_exception_in_the_programs_code(eng: Engine) -> None:
    @sgl.function
    def buggy(s: Any) -> None:
        s += "Count:" + sgl.gen("n", max_tokens=3)
        if s["n"] is not None:
            raise KeyError("the tool crashed")

    with pytest.raises(sgl.ProgramError) as info:
        buggy.run()
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value.state.error(), KeyError)


def test_a_failed_request(eng: Engine) -> None:
    @sgl.function
    def too_long(s: Any) -> None:
        s += "word " * 9000 + sgl.gen("x", max_tokens=2)  # past the model's context

    with pytest.raises(sgl.ProgramError, match="context"):
        too_long.run()


def test_errors_surface_from_arun_and_in_batches(eng: Engine) -> None:
    @sgl.function
    def maybe(s: Any, t: float) -> None:
        s += "Say:" + sgl.gen("x", max_tokens=3, temperature=t)

    async def main() -> None:
        with pytest.raises(sgl.ProgramError):
            await maybe.arun(t=-5.0)

    asyncio.run(main())
    states = maybe.run_batch([{"t": 0.0}, {"t": -5.0}, {"t": 0.0}])
    assert states[0].error() is None and states[2].error() is None
    assert isinstance(states[1].error(), ValueError)
    assert states[0]["x"] == states[2]["x"]


def test_misuse_is_reported(eng: Engine) -> None:
    @sgl.function
    def nested(s: Any) -> None:
        with s.user():
            s += sgl.assistant("no")

    with pytest.raises(sgl.ProgramError, match="nest"):
        nested.run()
    with pytest.raises(TypeError):
        nested.run(unknown_argument=1)
    with pytest.raises(ValueError):
        sgl.select("x", [])
    with pytest.raises(TypeError):
        sgl.function(lambda x: None)


IP = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"


def test_constrained_gen_is_never_unconstrained(eng: Engine) -> None:
    @sgl.function
    def ip(s: Any) -> None:
        s += "Q: What is the IP address of a DNS server?\nA: "
        s += sgl.gen(
            "ip", max_tokens=16, regex=r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
        )

    assert re.fullmatch(r"(\d{1,3}\.){3}\d{1,3}", ip.run(temperature=0)["ip"])


def test_no_backend_starts_the_embedded_model(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import radixserve.blocking
    from radixserve.lang import defaults

    asked: list[dict[str, Any]] = []

    def fake_engine(**kw: Any) -> Engine:  # the shared engine stands in for a second model
        asked.append(kw)
        return eng

    monkeypatch.setattr(radixserve.blocking, "Engine", fake_engine)
    monkeypatch.setattr(defaults, "_default", None)

    @sgl.function
    def hi(s: Any) -> None:
        s += "Hi" + sgl.gen("x", max_tokens=2)

    assert isinstance(hi.run()["x"], str)
    assert asked == [{"model": "smollm2-135m-instruct"}]
    hi.run()
    assert len(asked) == 1  # started once
    monkeypatch.setattr(defaults, "_default", defaults.as_backend(eng))
