"""Programs share their prefixes on purpose: batch prefix, select over k choices, fork trunks.

Cache use is read from each request's usage (cached_tokens) and the engine's
admitted-token counters; select's scores are checked against transformers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import radixserve.lang as sgl
from radixserve import Engine

FEW_SHOT = "".join(
    f"Q: What is the capital of {c}?\nA: {a}\n"
    for c, a in [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid")]
)


@sgl.function
def qa(s: Any, question: str) -> None:
    s += "Answer each question with one word.\n" + FEW_SHOT
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=4, stop="\n")


def _computed(before: dict[str, int], after: dict[str, int]) -> int:
    """Prompt tokens the engine had to compute (admitted minus served from the cache)."""
    return (after["prompt_tokens"] - before["prompt_tokens"]) - (
        after["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    )


def test_run_batch_prefills_the_few_shot_prefix_once(eng: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert eng.flush_cache()
    prefix = len(eng.tokenizer.encode("Answer each question with one word.\n" + FEW_SHOT))
    questions = [
        "What is the capital of Japan?",
        "What is the capital of Peru?",
        "What is 2+2?",
        "Who are you?",
    ]
    states = qa.run_batch(
        [{"question": q} for q in questions], temperature=0, progress_bar=True, num_threads=4
    )
    assert "4/4" in capsys.readouterr().err  # the progress bar ran to the end
    for st, q in zip(states, questions):
        assert st.error() is None
        assert st.text().startswith("Answer each question with one word.\n" + FEW_SHOT + "Q: " + q)
        assert st.get_meta_info("answer")["cached_tokens"] >= prefix
    # Same answers as one program at a time.
    assert [st["answer"] for st in states] == [qa.run(question=q, temperature=0)["answer"] for q in questions]


def test_async_run_batch_prefills_the_prefix_too(eng: Engine) -> None:
    assert eng.flush_cache()
    prefix = len(eng.tokenizer.encode("Answer each question with one word.\n" + FEW_SHOT))
    batch = [("What is the capital of Chile?",), ("What is the capital of Egypt?",)]

    async def main() -> list[Any]:
        return await qa.arun_batch(batch, temperature=0, concurrency=2)

    states = eng.run(main())
    assert all(st.get_meta_info("answer")["cached_tokens"] >= prefix for st in states)


CHOICES = [" True", " False", " Unknown", " It depends on the context"]


@sgl.function
def pick(s: Any, statement: str) -> None:
    s += "Decide whether each statement is True, False, or Unknown.\n" + FEW_SHOT
    s += "Statement: " + statement + "\nAnswer:"
    s += sgl.select("answer", CHOICES)


def test_select_over_k_choices_costs_one_prefill_of_the_prefix(eng: Engine) -> None:
    assert eng.flush_cache()
    tok = eng.tokenizer
    prompt = "Decide whether each statement is True, False, or Unknown.\n" + FEW_SHOT
    prompt += "Statement: Snow is cold.\nAnswer:"
    p = len(tok.encode(prompt))
    choice_tokens = [len(tok.encode(prompt + c)) - p for c in CHOICES]
    before = eng.stats()
    st = pick.run(statement="Snow is cold.")
    computed = _computed(before, eng.stats())
    # The prefix once, then each choice's own tokens (and the prefix's last token, whose
    # logits score the choice's first token); k prefills would be 4 * p.
    assert computed <= p + sum(c + 1 for c in choice_tokens)
    assert computed < 2 * p
    usage = st.get_meta_info("answer")["usage"]
    assert len(usage) == 4 and all(u["cached_tokens"] >= p - 1 for u in usage)


def test_select_scores_equal_transformers(eng: Engine, hf_model: Any) -> None:
    hf = hf_model
    tok = eng.tokenizer
    st = pick.run(statement="Fire is hot.")
    prompt = st.text()[: -len(st["answer"])]
    meta = st.get_meta_info("answer")
    for choice, mean_lp in zip(CHOICES, meta["normalized_prompt_logprobs"]):
        p_ids, ids = tok.encode(prompt), tok.encode(prompt + choice)
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        start = next(i for i, (a, b) in enumerate(zip(p_ids + [-1], ids)) if a != b)
        ref = [logp[i - 1, ids[i]].item() for i in range(start, len(ids))]
        assert mean_lp == pytest.approx(sum(ref) / len(ref), abs=2e-3)
    best = max(range(4), key=lambda i: meta["normalized_prompt_logprobs"][i])
    assert st["answer"] == CHOICES[best]


def test_each_fork_branch_reads_the_trunk_from_the_cache(eng: Engine) -> None:
    assert eng.flush_cache()
    trunk_text = "Here is a long shared context that every branch reads before it writes.\n" + FEW_SHOT
    trunk = len(eng.tokenizer.encode(trunk_text))
    seen: list[Any] = []

    @sgl.function
    def prog(s: Any) -> None:
        s += trunk_text
        forks = s.fork(3)
        forks += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=4, stop="\n")
        seen.extend(forks[i].get_meta_info("idea") for i in range(3))
        forks.join()

    st = prog.run(temperature=0)
    assert len(seen) == 3 and all(m["cached_tokens"] >= trunk - 1 for m in seen)
    assert len(st["idea"]) == 3 and prog.run(temperature=0)["idea"] == st["idea"]
