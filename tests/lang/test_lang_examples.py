"""The frontend-language examples run on the shared engine (fastapi/httpx: dev requirements)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from script_loader import load_example

from radixserve import Engine


def test_few_shot_example(eng: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    eng.flush_cache()
    states = load_example("lang_few_shot").main(backend=eng, countries=("Spain", "Peru"))
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["Spain", "Peru"]
    assert all(st.get_meta_info("answer")["cached_tokens"] > 40 for st in states)


def test_agent_example(eng: Engine) -> None:
    ex = load_example("lang_agent")
    assert ex.calculate("17*23") == "391" and ex.calculate("__import__('os')").startswith("error")
    st = ex.main(backend=eng)
    assert st["action_0"] in ("calculate", "finish") and isinstance(st["answer"], str)


def test_fork_join_example(eng: Engine) -> None:
    st = load_example("lang_fork_join").main(backend=eng)
    assert len(st["answer"]) == 5
    assert st.text().splitlines()[-1].removeprefix("Final answer: ") in {a.strip() for a in st["answer"]}


def test_fastapi_streaming_example(eng: Engine) -> None:
    app = load_example("lang_fastapi_stream").create_app(engine=eng)

    async def main() -> list[Any]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                r = await client.post("/ask", json={"question": "Name a color.", "max_tokens": 8})
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                return [json.loads(c[6:]) for c in r.text.split("\n\n") if c]

    events = asyncio.run(main())
    assert events[-1] == {"done": True} and len(events) > 2
    streamed = "".join(e["delta"] for e in events[:-1])
    ex = load_example("lang_fastapi_stream")
    assert (
        streamed
        == ex.answer.run(question="Name a color.", max_tokens=8, temperature=0, backend=eng)["answer"]
    )
