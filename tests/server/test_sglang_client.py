"""SGLang's own frontend client, `sglang.RuntimeEndpoint`, unchanged against a radixserve server.

CI installs `sglang` with `--no-deps` (its frontend needs only light packages);
references come from transformers' greedy decoding and log-softmax.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixserve.server.runner import ServerThread

from .conftest import API_KEY, settled

sgl = pytest.importorskip("sglang", reason="sglang is not installed (pip install --no-deps sglang==0.5.23)")


@pytest.fixture(scope="module")
def server(live: ServerThread) -> Iterator[ServerThread]:
    sgl.set_default_backend(sgl.RuntimeEndpoint(live.url, api_key=API_KEY))
    yield live
    sgl.set_default_backend(None)


@pytest.fixture(scope="module")
def hf(hf_model: Any, tokenizer: Any) -> Any:
    return hf_model, tokenizer


def hf_text(hf: Any, prompt: str, n: int, stop: str | None = None) -> str:
    """transformers' greedy continuation of `prompt`, cut at `stop` like SGLang does."""
    model, tok = hf
    ids = tok.encode(prompt)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, pad_token_id=2)
    text = str(tok.decode(out[0, len(ids) :], skip_special_tokens=True))
    return text.split(stop)[0] if stop else text


@sgl.function
def qa(s: Any, question: str) -> None:
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=12, stop="\n")


def test_gen_matches_transformers(server: ServerThread, hf: Any) -> None:
    state = qa.run(question="What is the capital of France?", temperature=0)
    prompt = "Question: What is the capital of France?\nAnswer:"
    assert state["answer"] == hf_text(hf, prompt, 12, stop="\n")
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] == len(hf[1].encode(prompt)) and meta["finish_reason"]["type"] in (
        "stop",
        "length",
    )
    settled(server)


def test_run_batch_and_streaming(server: ServerThread, hf: Any) -> None:
    questions = ["Name a color.", "What is 2 plus 2?"]
    states = qa.run_batch([{"question": q} for q in questions], temperature=0)
    for q, st in zip(questions, states):
        assert st["answer"] == hf_text(hf, f"Question: {q}\nAnswer:", 12, stop="\n")
    streamed = story.run(temperature=0, stream=True)
    pieces = list(streamed.text_iter("story"))
    whole = story.run(temperature=0)["story"]
    assert len(pieces) > 1 and "".join(pieces) == whole == hf_text(hf, "Once upon a time", 10)


@sgl.function
def story(s: Any) -> None:
    s += "Once upon a time"
    s += sgl.gen("story", max_tokens=10, ignore_eos=True)


def choice_scores(hf: Any, prefix: str, choices: list[str]) -> list[float]:
    """SGLang's token-length-normalized logprob of each choice, computed with transformers."""
    model, tok = hf
    start = max(len(tok.encode(prefix)) - 2, 0)  # RuntimeEndpoint.select's logprob_start_len
    scores = []
    for c in choices:
        ids = tok.encode(prefix + c)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        vals = [lp[p - 1, ids[p]].item() for p in range(start + 1, len(ids))]
        scores.append(sum(vals) / len(vals))
    return scores


@sgl.function
def capital(s: Any, choices: list[str]) -> None:
    s += "The capital of France is"
    s += sgl.select("city", choices=choices)


def test_select_picks_what_transformers_scores_best(server: ServerThread, hf: Any) -> None:
    choices = [" Paris", " London", " a large banana"]
    state = capital.run(choices=choices, temperature=0)
    scores = choice_scores(hf, "The capital of France is", choices)
    assert state["city"] == choices[scores.index(max(scores))]
    got = state.get_meta_info("city")["normalized_prompt_logprobs"]
    assert all(abs(a - b) < 1e-3 for a, b in zip(got, scores))
    settled(server)


@sgl.function
def two_tips(s: Any) -> None:
    s += "Here are two tips for staying healthy.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:"
        f += sgl.gen("tip", max_tokens=10, stop="\n")
    forks.join()
    s += "Tip 1:" + forks[0]["tip"] + "\nTip 2:" + forks[1]["tip"] + "\n"


def test_fork_runs_each_branch_like_transformers(server: ServerThread, hf: Any) -> None:
    state = two_tips.run(temperature=0)
    head = "Here are two tips for staying healthy.\n"
    for i in (1, 2):
        expected = hf_text(hf, head + f"Tip {i}:", 10, stop="\n")
        assert f"Tip {i}:{expected}\n" in state.text()
    settled(server)


@sgl.function
def pick_number(s: Any) -> None:
    s += "My favourite number is "
    s += sgl.gen("number", max_tokens=4, regex=r"[0-9]{2}")
    s += " and I am "
    s += sgl.gen("age", max_tokens=4, dtype=int)


def test_regex_and_dtype_constrain_the_output(server: ServerThread) -> None:
    state = pick_number.run(temperature=0)
    assert re.fullmatch(r"[0-9]{2}", state["number"]), state["number"]
    assert re.fullmatch(r"[+-]?[0-9]+", state["age"].strip()), state["age"]


def test_endpoint_maintenance_calls(server: ServerThread) -> None:
    ep = sgl.RuntimeEndpoint(server.url, api_key=API_KEY)
    assert ep.get_model_name() == "smollm2-135m-instruct"
    assert "internal_states" in ep.get_server_info()
    ep.cache_prefix("A prefix worth caching for later requests")
    assert server.call(server.engine.stats)["cached_tokens"] > 0
    ep.flush_cache()
    assert server.call(server.engine.stats)["cached_tokens"] == 0
    settled(server)
