"""The real `openai` client against radixserve on 127.0.0.1: what it sends, radixserve answers.

References come from the same engine in process (`engine.complete`, greedy),
whose equality with transformers' `generate` the engine tests establish.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixserve import RequestOutput, SamplingParams
from radixserve.server.runner import ServerThread

from .conftest import MODEL, settled

CHAT = [{"role": "user", "content": "Name three fruits."}]


def reference(live: ServerThread, prompt: Any, **kw: Any) -> RequestOutput:
    params = SamplingParams(temperature=0, **kw)
    out = live.call(lambda: live.engine.complete(prompt, params))
    assert isinstance(out, RequestOutput)
    return out


def test_models(client: Any) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_greedy_equals_engine(client: Any, live: ServerThread) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    ref = reference(live, CHAT, max_tokens=12)
    assert r.object == "chat.completion" and r.model == MODEL and len(r.choices) == 1
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == ref.usage.prompt_tokens
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_completion_tokens_and_stop(client: Any, live: ServerThread) -> None:
    ref = reference(live, CHAT, max_tokens=10)
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    stop = ref.text.split()[1]  # a word in the middle of the greedy answer
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].message.content
    assert ref.text.startswith(r.choices[0].message.content)


def test_completions_batch_with_logprobs(client: Any, live: ServerThread) -> None:
    prompts = ["The capital of France is", "One, two, three,"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, logprobs=2)
    assert [c.index for c in r.choices] == [0, 1]
    for p, c in zip(prompts, r.choices):
        ref = reference(live, p, max_tokens=5, logprobs=True, top_logprobs=2)
        assert c.text == ref.text
        # batched with the other prompt on the server: equal up to float32 reduction order
        assert c.logprobs.token_logprobs == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)
        assert all(
            len(top) <= 2 and max(top.values()) == lp
            for top, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs)
        )
        assert "".join(c.logprobs.tokens) == c.text
    assert r.usage.completion_tokens == sum(len(reference(live, p, max_tokens=5).token_ids) for p in prompts)


def test_chat_logprobs(client: Any, live: ServerThread) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    ref = reference(live, CHAT, max_tokens=4, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([lp.logprob for lp in ref.logprobs], abs=1e-4)
    for c, lp in zip(content, ref.logprobs):
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob == c.logprob  # greedy: the top one
        assert [t.logprob for t in c.top_logprobs] == pytest.approx([x[1] for x in lp.top], abs=1e-4)
        assert bytes(c.bytes).decode() == c.token
    assert "".join(c.token for c in content) == r.choices[0].message.content


def test_chat_streaming_with_usage(client: Any, live: ServerThread) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    ref = reference(live, CHAT, max_tokens=12)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == len(ref.token_ids)
    assert all(c.usage is None for c in body)
    assert "".join(c.choices[0].delta.content or "" for c in body) == ref.text
    assert [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason] == [ref.finish_reason]


def test_completions_streaming_n(client: Any) -> None:
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=7, n=3, stream=True
    )
    texts = ["", "", ""]
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2} and all(texts)
    again = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=7, n=3)
    assert [c.text for c in again.choices] == texts  # seeded: streamed or not, the same completions


def test_chat_n_seeded(client: Any) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=CHAT, max_tokens=8, temperature=1.0, seed=3, n=3)
    r = client.chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # different samples
    assert [c.message.content for c in client.chat.completions.create(**kw).choices] == [
        c.message.content for c in r.choices
    ]


def test_cached_tokens_on_repeated_system_prompt(client: Any, live: ServerThread) -> None:
    system = {"role": "system", "content": "You are a meticulous assistant for a botanical garden. " * 12}
    first = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "What is a fern?"}], max_tokens=2
    )
    second = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "What is a moss?"}], max_tokens=2
    )
    tok = live.engine.tokenizer
    system_tokens = len(
        tok.encode(tok.apply_chat_template([system], tokenize=False), add_special_tokens=False)
    )
    assert system_tokens > 100
    assert second.usage.prompt_tokens_details.cached_tokens >= system_tokens - 2
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < system_tokens // 2  # a new system prompt
    settled(live)


def test_sampling_options_pass_through(client: Any, live: ServerThread) -> None:
    banned = live.engine.tokenizer.encode(reference(live, CHAT, max_tokens=1).text)[0]
    r = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=6,
        temperature=0,
        logit_bias={str(banned): -100},
        presence_penalty=0.5,
        frequency_penalty=0.5,
        top_p=0.9,
    )
    ids = live.engine.tokenizer.encode(r.choices[0].message.content)
    assert ids and ids[0] != banned


def test_response_format_json_schema(client: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"name", "age"} and isinstance(data["name"], str) and isinstance(data["age"], int)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me JSON."}],
        max_tokens=48,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_hostile_schemas_are_400s_naming_the_problem(client: Any) -> None:
    import openai

    node = {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}
    lookaround = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?=.*[0-9]).+$"}}}
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(140):  # past GrammarLimits.max_depth (128), within the body's max_json_depth (160)
        deep = {"type": "array", "items": deep}
    cases = [
        (lookaround, "properties.code.pattern uses a lookahead"),
        ({"enum": list(range(5000))}, "GrammarLimits.max_enum_values"),
        (deep, "GrammarLimits.max_depth"),
        ({"$ref": "#/$defs/n", "$defs": {"n": node}}, "admits no finite output"),
    ]
    for schema, message in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "JSON?"}],
                max_tokens=8,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            )
        assert info.value.status_code == 400 and message in str(info.value)


def test_extension_parameters_via_extra_body(client: Any) -> None:
    r = client.completions.create(
        model=MODEL,
        prompt="Hi",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "min_tokens": 12, "top_k": 5, "repetition_penalty": 1.1},
    )
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
