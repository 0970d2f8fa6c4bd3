"""The frontend language over HTTP: the same programs through `RemoteBackend` and in process.

Both backends drive the one engine of the live server (the in-process one on the
server's own event loop), so a program must give the same text, decisions and
usage either way; the in-process backend's equality with transformers is shown
in tests/lang.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import radixserve.lang as sgl
from radixserve.lang.chat_template import template_from_tokenizer
from radixserve.lang.engine_backend import EngineBackend
from radixserve.lang.http_backend import RemoteBackend
from radixserve.server.runner import ServerThread

from .conftest import API_KEY, settled


@pytest.fixture(scope="module")
def backends(live: ServerThread) -> Iterator[tuple[RemoteBackend, EngineBackend]]:
    yield RemoteBackend(live.url, api_key=API_KEY), EngineBackend(live.engine)
    settled(live)


FEW_SHOT = "Q: What is the capital of France?\nA: Paris\nQ: What is the capital of Italy?\nA: Rome\n"


@sgl.function
def qa(s: Any, question: str) -> None:
    s += FEW_SHOT + "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n", max_tokens=8)


@sgl.function
def chat(s: Any, q: str) -> None:
    s += sgl.system("You are terse.")
    s += sgl.user(q)
    s += sgl.assistant(sgl.gen("reply", max_tokens=8))


@sgl.function
def pick(s: Any) -> None:
    s += "The capital of Germany is"
    s += sgl.select("city", choices=[" Berlin", " Paris", " a small village near the sea"])


@sgl.function
def pick_unconditional(s: Any) -> None:
    s += "My favourite fruit is"
    s += sgl.select(
        "fruit", choices=[" apple", " banana"], choices_method=sgl.unconditional_likelihood_normalized
    )


@sgl.function
def tips(s: Any) -> None:
    s += "Two tips for sleeping well:\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}."
        f += sgl.gen("tip", max_tokens=8, stop="\n")
    forks.join()
    s += "1." + forks[0]["tip"] + "\n2." + forks[1]["tip"]


@sgl.function
def scored(s: Any) -> None:
    s += "Once upon a time"
    s += sgl.gen("story", max_tokens=6, return_logprob=True, logprob_start_len=2, top_logprobs_num=2)


def _usage(meta: dict[str, Any]) -> tuple[Any, ...]:
    return meta["prompt_tokens"], meta["completion_tokens"], meta["finish_reason"]


def test_programs_run_the_same_remotely(backends: tuple[RemoteBackend, EngineBackend]) -> None:
    remote, local = backends
    for prog, kw, var in [
        (qa, {"question": "What is the capital of Spain?"}, "answer"),
        (chat, {"q": "Name a planet."}, "reply"),
    ]:
        a = prog.run(**kw, temperature=0, backend=remote)
        b = prog.run(**kw, temperature=0, backend=local)
        assert a.text() == b.text() and a[var]
        assert _usage(a.get_meta_info(var)) == _usage(b.get_meta_info(var))
    assert tips.run(temperature=0, backend=remote).text() == tips.run(temperature=0, backend=local).text()


def test_chat_template_comes_from_the_server(
    backends: tuple[RemoteBackend, EngineBackend], live: ServerThread
) -> None:
    remote, _ = backends
    got = live.call(remote.chat_template)
    assert got == template_from_tokenizer(live.engine.tokenizer)


def test_select_scores_like_in_process(backends: tuple[RemoteBackend, EngineBackend]) -> None:
    remote, local = backends
    for prog, var in [(pick, "city"), (pick_unconditional, "fruit")]:
        a, b = prog.run(temperature=0, backend=remote), prog.run(temperature=0, backend=local)
        assert a[var] == b[var]
        ma, mb = a.get_meta_info(var), b.get_meta_info(var)
        assert all(
            abs(x - y) < 1e-3
            for x, y in zip(ma["normalized_prompt_logprobs"], mb["normalized_prompt_logprobs"])
        )
        for ra, rb in zip(ma["input_token_logprobs"], mb["input_token_logprobs"]):
            assert [t[1] for t in ra] == [t[1] for t in rb] and [t[2] for t in ra] == [t[2] for t in rb]


def test_logprobs_streaming_and_batches(backends: tuple[RemoteBackend, EngineBackend]) -> None:
    remote, local = backends
    a, b = scored.run(temperature=0, backend=remote), scored.run(temperature=0, backend=local)
    ma, mb = a.get_meta_info("story"), b.get_meta_info("story")
    assert a["story"] == b["story"]
    for key in ("output_token_logprobs", "input_token_logprobs"):
        assert [t[1] for t in ma[key]] == [t[1] for t in mb[key]] and ma[key]
        assert all(abs(x[0] - y[0]) < 1e-3 for x, y in zip(ma[key], mb[key]))
    assert [[t[1] for t in row] for row in ma["output_top_logprobs"]] == [
        [t[1] for t in row] for row in mb["output_top_logprobs"]
    ]
    streamed = qa.run(question="What is the capital of Japan?", temperature=0, stream=True, backend=remote)
    text = "".join(streamed.text_iter("answer"))
    assert text == qa.run(question="What is the capital of Japan?", temperature=0, backend=local)["answer"]
    qs = [{"question": q} for q in ("What is 1 plus 1?", "Name a fruit.")]
    ra = qa.run_batch(qs, temperature=0, backend=remote)
    rb = qa.run_batch(qs, temperature=0, backend=local)
    assert [s.text() for s in ra] == [s.text() for s in rb]


def test_errors_and_cache_calls(backends: tuple[RemoteBackend, EngineBackend], live: ServerThread) -> None:
    remote, _ = backends
    wrong = RemoteBackend(live.url, api_key="not-the-key")
    with pytest.raises(Exception, match="API key"):
        qa.run(question="Hi?", backend=wrong)
    with pytest.raises(Exception, match="temperature"):
        qa.run(question="Hi?", temperature=-1.0, backend=remote)
    meta = live.call(lambda: remote.cache_prefix("A prefix for the remote cache test"))
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] == 0
    assert sgl.flush_cache(remote) is True
    assert live.call(live.engine.stats)["cached_tokens"] == 0


@sgl.function
def constrained(s: Any) -> None:
    s += "A two-digit number: "
    s += sgl.gen("num", max_tokens=4, regex=r"[0-9]{2}")
    s += "\nAn integer: "
    s += sgl.gen("int", max_tokens=4, dtype=int)


def test_structured_gen_remotely(backends: tuple[RemoteBackend, EngineBackend]) -> None:
    """regex and dtype go to the server's grammar engine (passes with structured output merged)."""
    remote, local = backends
    a, b = constrained.run(temperature=0, backend=remote), constrained.run(temperature=0, backend=local)
    assert a.text() == b.text()
    assert re.fullmatch(r"[0-9]{2}", a["num"]) and re.fullmatch(r"[-+]?[0-9]+", a["int"])
