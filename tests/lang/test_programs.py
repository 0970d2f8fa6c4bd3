"""SGLang-style programs on the embedded model: structure, not knowledge.

Greedy programs must equal the same calls made directly on the engine (which in
turn equals transformers, tests/engine), and run the same way twice.
"""

from __future__ import annotations

import re
from typing import Any

import radixserve.lang as sgl
from radixserve import Engine, SamplingParams

FEW_SHOT = (
    "The following are questions with answers.\n\n"
    "Q: What is the capital of France?\nA: Paris\n"
    "Q: What is the capital of Germany?\nA: Berlin\n"
    "Q: What is the capital of Italy?\nA: Rome\n"
)


@sgl.function
def few_shot_qa(s: Any, question: str) -> None:
    s += FEW_SHOT
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n", max_tokens=8)


def test_few_shot_qa_equals_the_engine_and_is_deterministic(eng: Engine) -> None:
    q = "What is the capital of Japan?"
    st = few_shot_qa.run(question=q, temperature=0)
    answer = st["answer"]
    assert isinstance(answer, str) and answer and "\n" not in answer
    prompt = FEW_SHOT + "Q: " + q + "\nA:"
    direct = eng.complete(prompt, SamplingParams(max_tokens=8, stop=["\n"], temperature=0))
    assert answer == direct.text
    assert st.text() == prompt + answer
    meta = st.get_meta_info("answer")
    assert meta["prompt_tokens"] == len(eng.tokenizer.encode(prompt))
    assert meta["completion_tokens"] >= 1 and meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["cached_tokens"] >= 0
    again = few_shot_qa(question=q, temperature=0)  # calling the function runs it, as in SGLang
    assert again.text() == st.text()


@sgl.function
def multi_turn(s: Any, q1: str, q2: str) -> None:
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(q1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=10))
    with s.user():
        s += q2
    s += sgl.assistant_begin()
    s += sgl.gen("answer_2", max_tokens=10)
    s += sgl.assistant_end()


def test_multi_turn_roles_render_the_tokenizers_chat_template(eng: Engine, tokenizer: Any) -> None:
    st = multi_turn.run(q1="Name a color.", q2="Name another one.", temperature=0)
    msgs = st.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == "Name a color." and msgs[3]["content"] == "Name another one."
    assert msgs[2]["content"] == st["answer_1"] and msgs[4]["content"] == st["answer_2"]
    # The program's text is exactly what the chat template renders for its messages.
    assert st.text() == tokenizer.apply_chat_template(msgs, tokenize=False)
    # Each assistant turn equals a chat request on the engine with the messages before it.
    sp = SamplingParams(max_tokens=10, temperature=0)
    assert eng.complete(msgs[:2], sp).text == st["answer_1"]
    assert eng.complete(msgs[:4], sp).text == st["answer_2"]


def test_first_user_turn_gets_the_templates_default_system_prompt(eng: Engine, tokenizer: Any) -> None:
    @sgl.function
    def ask(s: Any, q: str) -> None:
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=6))

    st = ask.run(q="Hi!", temperature=0)
    assert len(st.messages()) == 2
    assert st.text() == tokenizer.apply_chat_template(st.messages(), tokenize=False)
    assert eng.complete(st.messages()[:1], SamplingParams(max_tokens=6, temperature=0)).text == st["a"]


@sgl.function
def true_or_false(s: Any, statement: str) -> None:
    s += "Determine whether the statement below is True, False, or Unknown.\n"
    s += "Statement: The capital of France is Paris.\nAnswer: True\n"
    s += "Statement: " + statement + "\n"
    s += "Answer:" + sgl.select("answer", ["True", "False", "Unknown"])


def test_select_picks_one_of_the_choices_with_every_method(eng: Engine) -> None:
    for method in (
        sgl.token_length_normalized,
        sgl.greedy_token_selection,
        sgl.unconditional_likelihood_normalized,
    ):

        @sgl.function
        def tf(s: Any, statement: str, method: Any) -> None:
            s += "Statement: " + statement + "\nAnswer:"
            s += sgl.select("answer", ["True", "False", "Unknown"], choices_method=method)

        st = tf.run(statement="The sky is green.", method=method)
        assert st["answer"] in ("True", "False", "Unknown")
        assert st.text().endswith("Answer:" + st["answer"])
        meta = st.get_meta_info("answer")
        assert len(meta["normalized_prompt_logprobs"]) == 3
    assert "normalized_unconditional_prompt_logprobs" in meta


def test_gen_with_choices_is_a_select(eng: Engine) -> None:
    @sgl.function
    def pick(s: Any) -> None:
        s += "My favourite fruit is the" + sgl.gen("fruit", choices=[" apple", " banana"])

    st = pick.run()
    assert st["fruit"] in (" apple", " banana")


def test_gen_int_and_dtype_int_give_integers(eng: Engine) -> None:
    @sgl.function
    def numbers(s: Any) -> None:
        s += "The number of hours in a day is " + sgl.gen_int("hours", max_tokens=4) + ".\n"
        s += "The number of days in a week is " + sgl.gen("days", dtype=int, max_tokens=4) + ".\n"

    st = numbers.run(temperature=0)
    for name in ("hours", "days"):
        assert re.fullmatch(r"[-+]?[0-9]+", st[name]), st.text()
        int(st[name])
    assert st.get_meta_info("days")["completion_tokens"] >= 1


def test_n_completions(eng: Engine) -> None:
    @sgl.function
    def names(s: Any) -> None:
        s += "A good name for a cat is" + sgl.gen("name", n=3, max_tokens=5, temperature=1.0, seed=7)

    st = names.run()
    assert isinstance(st["name"], list) and len(st["name"]) == 3
    assert all(isinstance(x, str) for x in st["name"])
    assert st.text() == "A good name for a cat is" + st["name"][0]
    assert len(st.get_meta_info("name")["choices"]) == 3
    assert names.run().text() == st.text()  # seeded: the same three again


def calculate(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/ ().]+", expression):
        return "error: not an arithmetic expression"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # only digits and operators reach here
    except Exception as e:  # 1/0, unbalanced brackets
        return f"error: {type(e).__name__}"


@sgl.function
def tool_agent(s: Any, question: str, max_steps: int = 3) -> None:
    s += "You can use calculate(expression) to compute.\n"
    s += "Example:\nQuestion: What is 3 times 4?\nAction: calculate(3*4)\nObservation: 12\nAction: finish\n"
    s += "Answer: 12\n\n"
    s += "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Action: " + sgl.select(f"action_{step}", ["calculate", "finish"])
        if s[f"action_{step}"] == "finish":
            s += "\nAnswer:" + sgl.gen("answer", max_tokens=8, stop="\n")
            return
        s += "(" + sgl.gen(f"expr_{step}", max_tokens=10, stop=")") + ")\n"
        s += "Observation: " + calculate(s[f"expr_{step}"]) + "\n"
    s += "Answer:" + sgl.gen("answer", max_tokens=8, stop="\n")


def test_tool_use_agent_with_control_flow(eng: Engine) -> None:
    st = tool_agent.run(question="What is 17 times 23?", temperature=0)
    actions = [st[f"action_{i}"] for i in range(3) if f"action_{i}" in st]
    assert actions and all(a in ("calculate", "finish") for a in actions)
    assert actions.count("finish") <= 1 and (actions[-1] == "finish" or len(actions) == 3)
    for i, a in enumerate(actions):
        if a == "calculate":
            assert f"Observation: {calculate(st[f'expr_{i}'])}\n" in st.text()
    assert isinstance(st["answer"], str) and "\n" not in st["answer"]
    assert tool_agent.run(question="What is 17 times 23?", temperature=0).text() == st.text()


@sgl.function
def self_consistency(s: Any, question: str, k: int = 3) -> None:
    s += "Answer with one word.\nQuestion: " + question + "\n"
    forks = s.fork(k)
    forks += lambda i: f"Attempt {i + 1}:" + sgl.gen("answer", max_tokens=4, stop="\n", seed=i)
    forks.join()
    votes: dict[str, int] = {}
    for a in s["answer"]:
        votes[a.strip()] = votes.get(a.strip(), 0) + 1
    s += "Final: " + max(votes, key=lambda a: votes[a])


def test_fork_join_self_consistency(eng: Engine) -> None:
    st = self_consistency.run(question="What color is snow?", temperature=0.9)
    answers = st["answer"]
    assert isinstance(answers, list) and len(answers) == 3
    assert st.text().startswith("Answer with one word.") and "Final: " in st.text()
    assert st.text().split("Final: ")[1] in {a.strip() for a in answers}
    # Each branch's text is the trunk plus its own attempt.
    assert self_consistency.run(question="What color is snow?", temperature=0.9).text() == st.text()


def test_var_scope_and_fork_concat(eng: Engine) -> None:
    @sgl.function
    def stmts(s: Any, facts: list[str]) -> None:
        s += "Memorize these statements.\n"
        forks = s.fork(len(facts))
        forks += [f"Statement {i}: {f}\n" for i, f in enumerate(facts)]
        forks.join(mode="concate_and_append")
        with s.var_scope("q"):
            s += "Who is the father of Julian?"
        s += "\nAnswer:" + sgl.gen("answer", max_tokens=6, stop="\n")

    st = stmts.run(facts=["Ethan is the father of Liam.", "Noah is the father of Julian."], temperature=0)
    assert "Statement 0: Ethan is the father of Liam.\nStatement 1: Noah" in st.text()
    assert st["q"] == "Who is the father of Julian?"
    assert isinstance(st["answer"], str)


def test_backend_argument_takes_an_async_engine_running_in_another_thread(eng: Engine) -> None:
    st = few_shot_qa.run(question="What is the capital of Spain?", temperature=0, backend=eng.engine)
    assert st.text() == few_shot_qa.run(question="What is the capital of Spain?", temperature=0).text()
    assert sgl.flush_cache() is True


def test_logprobs_in_meta_info(eng: Engine) -> None:
    @sgl.function
    def lp(s: Any) -> None:
        s += "One, two, three," + sgl.gen("x", max_tokens=3, return_logprob=True, top_logprobs_num=2)
        s += "\nAgain:" + sgl.gen("y", max_tokens=2, logprob_start_len=1)

    st = lp.run(temperature=0)
    meta = st.get_meta_info("x")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    direct = eng.complete("One, two, three,", SamplingParams(max_tokens=3, temperature=0, logprobs=True))
    assert [t[1] for t in meta["output_token_logprobs"]] == list(direct.token_ids)
    for (lp_value, _, _), ref in zip(meta["output_token_logprobs"], direct.logprobs):
        assert abs(lp_value - ref.logprob) < 1e-4
    ymeta = st.get_meta_info("y")
    assert len(ymeta["input_token_logprobs"]) == ymeta["prompt_tokens"] - 1
