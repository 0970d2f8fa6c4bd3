"""SGLang's native `/generate` and friends over HTTP on loopback, checked against transformers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from radixserve.server.runner import ServerThread

from .conftest import API_KEY, settled

PROMPT = "The capital of France is"
OTHER = "List three colors:"


@pytest.fixture(scope="module")
def client(live: ServerThread) -> Iterator[httpx.Client]:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=live.url, headers=auth, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def hf(hf_model: Any, tokenizer: Any) -> Any:
    return hf_model, tokenizer


def hf_greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    model, _ = hf
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, pad_token_id=2)
    return list(out[0, len(ids) :].tolist())


def hf_logprobs(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf[0](torch.tensor([ids])).logits[0].float(), dim=-1)


def greedy(max_new_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "temperature": 0, **kw}


def test_text_greedy_matches_transformers(client: httpx.Client, hf: Any, live: ServerThread) -> None:
    ids = hf[1].encode(PROMPT)
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": greedy(8, ignore_eos=True)})
    assert r.status_code == 200, r.text
    body = r.json()
    ref = hf_greedy(hf, ids, 8)
    assert body["output_ids"] == ref
    assert body["text"] == hf[1].decode(ref, skip_special_tokens=True)
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert isinstance(meta["id"], str) and meta["cached_tokens"] >= 0 and meta["e2e_latency"] > 0
    assert "output_token_logprobs" not in meta
    settled(live)


def test_answers_follow_sglangs_contract(client: httpx.Client) -> None:
    api = pytest.importorskip("sglang.api.v1.api_types", reason="sglang is not installed")
    req = {
        "text": [PROMPT, OTHER],
        "sampling_params": greedy(4),
        "return_logprob": True,
        "logprob_start_len": 1,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    api.GenerateRequest.from_json_value(req)  # what we send is valid SGLang
    r = client.post("/generate", json=req)
    assert r.status_code == 200, r.text
    for answer in r.json():
        decoded = api.GenerateResponse.from_json_value(answer)
        assert decoded.meta_info.prompt_tokens > 0
    with client.stream("POST", "/generate", json={**req, "stream": True}) as r:
        chunks = sse(r)
    assert chunks[-1] == "[DONE]"
    for chunk in chunks[:-1]:
        assert api.GenerateResponse.from_json_value(chunk).index in (0, 1)
    # What sglang.Runtime.generate posts (None for everything it was not given).
    body = {
        "text": PROMPT,
        "sampling_params": None,
        "return_logprob": False,
        "logprob_start_len": None,
        "top_logprobs_num": None,
        "lora_path": None,
        "session_id": None,
    }
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert api.GenerateResponse.from_json_value(r.json()).meta_info.completion_tokens > 0


def test_batched_input_ids_and_n(client: httpx.Client, hf: Any) -> None:
    prompts = [hf[1].encode(PROMPT), hf[1].encode(OTHER)]
    r = client.post("/generate", json={"input_ids": prompts, "sampling_params": greedy(6)})
    assert r.status_code == 200, r.text
    answers = r.json()
    assert isinstance(answers, list) and len(answers) == 2
    for p, a in zip(prompts, answers):
        assert a["output_ids"] == hf_greedy(hf, p, 6)
        assert a["meta_info"]["prompt_tokens"] == len(p)
    # n > 1 on one prompt answers a list of n, like SGLang; seeded samples differ.
    sp = {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "sampling_seed": 7, "ignore_eos": True}
    answers = client.post("/generate", json={"text": PROMPT, "sampling_params": sp}).json()
    assert [len(a["output_ids"]) for a in answers] == [6, 6, 6]
    assert len({tuple(a["output_ids"]) for a in answers}) > 1
    assert len({a["meta_info"]["id"] for a in answers}) == 3
    # A batch with n: each prompt's n answers in turn.
    sp = {**sp, "n": 2, "max_new_tokens": 2}
    answers = client.post("/generate", json={"input_ids": prompts, "sampling_params": sp}).json()
    assert [a["meta_info"]["prompt_tokens"] for a in answers] == [len(prompts[0])] * 2 + [len(prompts[1])] * 2


def test_max_new_tokens_zero_prefills_into_the_cache(client: httpx.Client, hf: Any) -> None:
    text = "A prompt about prefill-only requests that nobody has sent before"
    n = len(hf[1].encode(text))
    r = client.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 0}})
    body = r.json()
    assert r.status_code == 200 and body["text"] == "" and body["output_ids"] == []
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert body["meta_info"]["completion_tokens"] == 0 and body["meta_info"]["prompt_tokens"] == n
    again = client.post("/generate", json={"text": text, "sampling_params": greedy(1)}).json()
    assert again["meta_info"]["cached_tokens"] == n - 1


def test_logprobs_from_logprob_start_len(client: httpx.Client, hf: Any) -> None:
    tok = hf[1]
    ids = tok.encode(PROMPT + " Paris, and Berlin is the capital of")
    start = 3
    req = {
        "input_ids": ids,
        "sampling_params": greedy(3),
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    meta = client.post("/generate", json=req).json()["meta_info"]
    out_ids = [t for _, t, _ in meta["output_token_logprobs"]]
    lp = hf_logprobs(hf, ids + out_ids)
    inp = meta["input_token_logprobs"]
    # SGLang's shape: one entry per prompt token from logprob_start_len, the first without a logprob.
    assert [t for _, t, _ in inp] == ids[start:]
    assert inp[0][0] is None and meta["input_top_logprobs"][0] is None
    for p, (val, tid, text) in zip(range(start + 1, len(ids)), inp[1:]):
        assert abs(val - lp[p - 1, tid].item()) < 1e-3
        assert text == tok.decode([tid])
    for k, (val, tid, _) in enumerate(meta["output_token_logprobs"]):
        row = lp[len(ids) - 1 + k]
        assert tid == row.argmax().item() and abs(val - row[tid].item()) < 1e-3
        assert [t for _, t, _ in meta["output_top_logprobs"][k]] == row.topk(2).indices.tolist()
    assert len(meta["input_top_logprobs"]) == len(inp) and meta["output_token_logprobs_length"] == 3
    # The default (-1) and the prompt's length give no prompt logprobs; past it is an error.
    for s in (-1, len(ids)):
        m = client.post("/generate", json={**req, "logprob_start_len": s}).json()["meta_info"]
        assert m["input_token_logprobs"] == [] and len(m["output_token_logprobs"]) == 3
    r = client.post("/generate", json={**req, "logprob_start_len": len(ids) + 1})
    assert r.status_code == 400 and "logprob_start_len" in r.json()["error"]["message"]


def sse(r: httpx.Response) -> list[Any]:
    events = []
    for line in r.iter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_streaming_is_cumulative_and_ends_with_done(client: httpx.Client, live: ServerThread) -> None:
    req = {"text": PROMPT, "sampling_params": greedy(8, ignore_eos=True), "stream": True}
    with client.stream("POST", "/generate", json=req) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[-1] == "[DONE]" and len(events) >= 3
    chunks = events[:-1]
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"]) and a["meta_info"]["finish_reason"] is None
    full = client.post("/generate", json={**req, "stream": False}).json()
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    # A batch streams every prompt's chunks, told apart by "index".
    batch = {**req, "text": [PROMPT, OTHER], "sampling_params": greedy(4, ignore_eos=True)}
    with client.stream("POST", "/generate", json=batch) as r:
        events = sse(r)
    finals = {e["index"]: e for e in events[:-1] if e["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1] and events[-1] == "[DONE]"
    settled(live)


def test_stop_strings_and_token_ids(client: httpx.Client) -> None:
    base = client.post("/generate", json={"text": PROMPT, "sampling_params": greedy(8)}).json()
    ids = base["output_ids"]
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": greedy(8, stop_token_ids=[ids[2]])})
    stopped = r.json()
    assert stopped["output_ids"] == ids[: ids.index(ids[2]) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[2]}
    word = base["text"].split()[1]
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": greedy(8, stop=[word])})
    assert r.json()["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in r.json()["text"]


def test_structured_output_constrains_the_text(client: httpx.Client) -> None:
    """regex, json_schema (a JSON string, as SGLang takes it) and ebnf reach the grammar engine."""

    def text(**constraint: str) -> str:
        sp = greedy(32, **constraint)
        r = client.post(
            "/generate", json={"text": "Answer in JSON: what color is grass?", "sampling_params": sp}
        )
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["finish_reason"]["type"] == "stop"
        return str(r.json()["text"])

    assert re.fullmatch("[0-9]{3}", text(regex="[0-9]{3}"))
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"]}
    assert json.loads(text(json_schema=json.dumps(schema)))["color"] in ("red", "green")
    assert text(ebnf='root ::= "yes" | "no"') in ("yes", "no")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"text": PROMPT, "input_ids": [1, 2]}, "exactly one of text or input_ids"),
        ({}, "exactly one of text or input_ids"),
        ({"text": PROMPT, "image_data": "http://127.0.0.1/x.png"}, "image_data"),
        ({"text": PROMPT, "sampling_params": {"max_new_token": 3}}, "max_new_token"),
        ({"text": PROMPT, "sampling_params": {"temperature": -1}}, "temperature"),
        ({"text": PROMPT, "sampling_params": {"stop_regex": "a+"}}, "stop_regex"),
        ({"text": PROMPT, "sampling_params": {"top_k": 0}}, "top_k"),
        ({"text": [PROMPT, OTHER], "sampling_params": [{}]}, "sampling_params"),
        ({"input_ids": [10**9]}, "input_ids"),
        ({"input_ids": []}, "empty"),
        ({"text": "word " * 9000}, "context"),
        ({"text": PROMPT, "return_logprob": True, "top_logprobs_num": 1000}, "top_logprobs"),
        ([1, 2, 3], "JSON object"),
    ],
)
def test_bad_requests_are_a_clear_400(client: httpx.Client, body: Any, needle: str) -> None:
    for stream in (False, True):
        payload = {**body, "stream": True} if stream and isinstance(body, dict) else body
        r = client.post("/generate", json=payload)
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]["message"]


def test_malformed_json_and_the_server_goes_on(client: httpx.Client, live: ServerThread) -> None:
    r = client.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert client.post("/generate", json={"text": PROMPT, "sampling_params": greedy(2)}).status_code == 200
    settled(live)


def test_a_client_that_leaves_mid_stream_frees_its_request(client: httpx.Client, live: ServerThread) -> None:
    req = {"text": OTHER, "sampling_params": greedy(200, ignore_eos=True), "stream": True}
    with client.stream("POST", "/generate", json=req) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # close after the first chunk
    settled(live)
    assert live.call(live.engine.stats)["running"] == 0


def test_abort_request_ends_a_stream_with_abort(client: httpx.Client, live: ServerThread) -> None:
    req = {"text": OTHER, "rid": "abort-me", "sampling_params": greedy(2000, ignore_eos=True), "stream": True}
    events = []
    with client.stream("POST", "/generate", json=req) as r:
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            events.append(line[5:].strip())
            if len(events) == 1:
                assert client.post("/abort_request", json={"rid": "abort-me"}).status_code == 200
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and len(last["output_ids"]) < 2000
    settled(live)
    r = client.post("/abort_request", json={"abort_all": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_feature"
    r = client.post("/start_profile")
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_feature"


def test_a_client_that_gives_up_aborts_its_batch(live: ServerThread) -> None:
    body = {"text": [PROMPT, OTHER], "sampling_params": greedy(2000, ignore_eos=True)}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{live.url}/generate", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.0
        )
    settled(live)  # asserts nothing runs any more well before 2000 tokens could be generated


def test_info_cache_and_health_endpoints(client: httpx.Client, live: ServerThread) -> None:
    info = client.get("/get_model_info").json()
    assert info["model_path"] == "smollm2-135m-instruct" and info["is_generation"] is True
    assert client.get("/model_info").json() == info
    for path in ("/server_info", "/get_server_info"):
        si = client.get(path).json()
        assert si["model"] == "smollm2-135m-instruct" and "running" in si["internal_states"][0]
    client.post("/generate", json={"text": PROMPT, "sampling_params": greedy(1)})
    assert live.call(live.engine.stats)["cached_tokens"] > 0
    r = client.post("/flush_cache")
    assert r.status_code == 200 and "flushed" in r.text
    assert live.call(live.engine.stats)["cached_tokens"] == 0
    assert client.get("/flush_cache").status_code == 405  # state changes are POST only
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200


def test_native_routes_share_the_apps_key_and_metrics(client: httpx.Client, live: ServerThread) -> None:
    r = httpx.post(f"{live.url}/generate", json={"text": PROMPT}, timeout=60)
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]

    def length_count() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith('radixserve_requests_total{finish_reason="length"}'):
                return float(line.split()[-1])
        return 0.0

    before = length_count()
    client.post("/generate", json={"text": [PROMPT, OTHER], "sampling_params": greedy(2, ignore_eos=True)})
    with client.stream(
        "POST", "/generate", json={"text": PROMPT, "stream": True, "sampling_params": greedy(2)}
    ) as r:
        sse(r)
    assert length_count() == before + 3
    settled(live)
