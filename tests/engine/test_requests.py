"""Request-level behaviour through the public API: stops, limits, sampling, aborts, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from radixserve import AsyncEngine, Engine, EngineDeadError, SamplingParams

from .conftest import engine_config, hf_greedy, run, with_engine

CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def engine() -> Any:
    """One blocking engine shared by this module's tests (its own event loop thread)."""
    eng = Engine(engine_config())
    yield eng
    eng.check_integrity()
    eng.close()


def test_sync_facade_streams_and_completes(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("The quick brown fox")
    outs = list(engine.generate(ids, SamplingParams(temperature=0, max_tokens=8)))
    assert [t for o in outs for t in o.delta_token_ids] == hf_greedy(hf_model, ids, 8)
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert "".join(o.delta_text for o in outs) == outs[-1].text
    assert outs[-1].text == tokenizer.decode(list(outs[-1].token_ids), skip_special_tokens=True)


def test_string_and_chat_prompts_are_tokenized_like_transformers(engine: Engine, tokenizer: Any) -> None:
    out = engine.complete("Hello there", SamplingParams(temperature=0, max_tokens=2))
    assert out.usage.prompt_tokens == len(tokenizer.encode("Hello there"))
    chat = engine.complete(CHAT, SamplingParams(temperature=0, max_tokens=2))
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert chat.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))


def test_eos_stops_and_ignore_eos_goes_on(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    out = engine.complete(CHAT, SamplingParams(temperature=0, max_tokens=64))
    assert out.finish_reason == "stop"
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert out.stop_reason == eos and out.token_ids[-1] == eos
    assert "<|im_end|>" not in out.text
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert list(out.token_ids) == hf_greedy(hf_model, tokenizer.encode(text, add_special_tokens=False), 64)
    longer = engine.complete(
        CHAT, SamplingParams(temperature=0, max_tokens=len(out.token_ids) + 5, ignore_eos=True)
    )
    assert longer.finish_reason == "length"
    assert len(longer.token_ids) == len(out.token_ids) + 5


def test_max_and_min_tokens(engine: Engine, tokenizer: Any) -> None:
    out = engine.complete("Once upon a time", SamplingParams(temperature=0, max_tokens=5))
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    first = engine.complete(CHAT, SamplingParams(temperature=0, max_tokens=64))
    n_free = len(first.token_ids)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    forced = engine.complete(CHAT, SamplingParams(temperature=0, max_tokens=64, min_tokens=n_free + 3))
    assert len(forced.token_ids) >= n_free + 3
    assert eos not in forced.token_ids[: n_free + 3]


def test_stop_strings_are_cut_from_the_output(engine: Engine) -> None:
    base = engine.complete("The capital of France is", SamplingParams(temperature=0, max_tokens=24))
    words = base.text.split()
    assert len(words) >= 3
    stop = words[2]
    cut = engine.complete(
        "The capital of France is", SamplingParams(temperature=0, max_tokens=24, stop=[stop])
    )
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == base.text[: base.text.index(stop)]
    assert stop not in cut.text
    kept = engine.complete(
        "The capital of France is",
        SamplingParams(temperature=0, max_tokens=24, stop=[stop], include_stop_str_in_output=True),
    )
    assert kept.text == base.text[: base.text.index(stop) + len(stop)]
    streamed = list(
        engine.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=24, stop=[stop]))
    )
    assert "".join(o.delta_text for o in streamed) == cut.text


def test_stop_token_ids(engine: Engine) -> None:
    base = engine.complete("Once upon a time", SamplingParams(temperature=0, max_tokens=10))
    tok = base.token_ids[3]
    out = engine.complete(
        "Once upon a time", SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[tok])
    )
    assert out.finish_reason == "stop" and out.stop_reason == tok
    assert out.token_ids == base.token_ids[: base.token_ids.index(tok) + 1]


def test_seed_reproducible_across_batch_compositions(engine: Engine) -> None:
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    alone = engine.complete("My favourite animal is", p)
    others = [("Tell me about the sea", SamplingParams(temperature=1.0, max_tokens=20)) for _ in range(5)]
    prompts = ["My favourite animal is"] + [o[0] for o in others]
    params = [p] + [o[1] for o in others]
    mixed = engine.generate_many(prompts, params)
    assert mixed[0].token_ids == alone.token_ids
    other_seed = engine.complete("My favourite animal is", p.replace(seed=99))
    assert other_seed.token_ids != alone.token_ids


def test_n_completions(engine: Engine) -> None:
    outs = engine.complete("Name a fruit:", SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=8))
    assert [o.index for o in outs] == [0, 1, 2]
    assert len({o.token_ids for o in outs}) > 1
    greedy = engine.complete("Name a fruit:", SamplingParams(temperature=0, n=2, max_tokens=8))
    assert greedy[0].token_ids == greedy[1].token_ids


def test_top_k_1_is_greedy_and_logit_bias_forces_a_token(engine: Engine) -> None:
    g = engine.complete("The sky is", SamplingParams(temperature=0, max_tokens=8))
    k1 = engine.complete("The sky is", SamplingParams(temperature=1.5, top_k=1, max_tokens=8))
    assert k1.token_ids == g.token_ids
    biased = engine.complete(
        "The sky is", SamplingParams(temperature=0.7, max_tokens=4, logit_bias={42: 100.0})
    )
    assert biased.token_ids == (42, 42, 42, 42)


def test_repetition_penalty_matches_transformers(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("one two one two one two one two")
    out = engine.complete(ids, SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.5))
    assert list(out.token_ids) == hf_greedy(hf_model, ids, 12, repetition_penalty=1.5)


def test_logprobs_match_transformers(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("Water boils at")
    out = engine.complete(ids, SamplingParams(temperature=0, max_tokens=4, logprobs=True, top_logprobs=3))
    full = torch.tensor([ids + list(out.token_ids)])
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(full).logits[0].float(), dim=-1)
    for k, tl in enumerate(out.logprobs):
        row = lp[len(ids) - 1 + k]
        assert tl.token_id == out.token_ids[k]
        assert abs(tl.logprob - row[tl.token_id].item()) < 1e-3
        assert [t for t, _ in tl.top] == row.topk(3).indices.tolist()


def test_prompt_logprobs_from_a_position(engine: Engine, tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("Paris is the capital of France and Berlin is the capital of Germany")
    start = 5
    engine.complete(ids, SamplingParams(temperature=0, max_tokens=1))  # cache the prompt first
    out = engine.complete(
        ids, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=True, prompt_logprobs_start=start)
    )
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    got = out.prompt_logprobs
    assert [t.token_id for t in got] == ids[start:]
    for p, tl in zip(range(start, len(ids)), got):
        assert abs(tl.logprob - lp[p - 1, ids[p]].item()) < 1e-3


def test_max_tokens_zero_prefills_into_the_cache(engine: Engine, tokenizer: Any) -> None:
    ids = tokenizer.encode("A completely new prompt about prefill-only requests and their cache")
    warm = engine.complete(ids, SamplingParams(max_tokens=0))
    assert warm.finished and warm.token_ids == () and warm.finish_reason == "length"
    again = engine.complete(ids, SamplingParams(temperature=0, max_tokens=1))
    assert again.usage.cached_tokens == len(ids) - 1


def test_bad_parameters_raise_in_the_caller() -> None:
    for kw, field in [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)


def test_bad_request_leaves_concurrent_requests_untouched(tokenizer: Any, hf_model: Any) -> None:
    ids = tokenizer.encode("In the beginning there was")
    ref = hf_greedy(hf_model, ids, 16)

    async def body(engine: AsyncEngine) -> None:
        task = asyncio.create_task(engine.complete(ids, SamplingParams(temperature=0, max_tokens=16)))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="context"):
            await engine.complete([1] * (engine.context_length + 5), SamplingParams(max_tokens=1))
        with pytest.raises(ValueError, match="stop_token_ids"):
            await engine.complete("hi", SamplingParams(stop_token_ids=[10**9]))
        with pytest.raises(ValueError, match="request_id"):
            agen1 = engine.generate(ids, SamplingParams(max_tokens=50), request_id="same")
            await agen1.__anext__()
            try:
                await engine.complete(ids, SamplingParams(max_tokens=2), request_id="same")
            finally:
                await agen1.aclose()
        out = await task
        assert list(out.token_ids) == ref
        assert engine.healthy
        await engine.check_integrity()

    run(lambda: _with(body))


def test_break_and_cancel_abort_and_free_kv(tokenizer: Any) -> None:
    ids = tokenizer.encode("Write a very long story about a dragon")

    async def body(engine: AsyncEngine) -> None:
        before = await engine.stats()
        async for out in engine.generate(ids, SamplingParams(max_tokens=500, ignore_eos=True)):
            if len(out.token_ids) >= 3:
                break
        task = asyncio.create_task(engine.complete(ids, SamplingParams(max_tokens=500, ignore_eos=True)))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the abort lands on the worker within a step or two
            s = await engine.stats()
            if s["running"] == 0 and s["waiting"] == 0:
                break
            await asyncio.sleep(0.01)
        assert s["running"] == 0 and s["waiting"] == 0
        await engine.check_integrity()
        assert s["free_slots"] + s["cached_tokens"] == before["total_slots"]
        assert await engine.flush_cache()
        s = await engine.stats()
        assert s["free_slots"] == s["total_slots"]

    run(lambda: _with(body))


def test_abort_by_id_reports_abort(tokenizer: Any) -> None:
    async def body(engine: AsyncEngine) -> None:
        outs = []
        async for out in engine.generate(
            "Count to one thousand:", SamplingParams(max_tokens=400, ignore_eos=True), request_id="r1"
        ):
            outs.append(out)
            if len(outs) == 2:
                await engine.abort("r1")
        assert outs[-1].finished and outs[-1].finish_reason == "abort"
        assert len(outs[-1].token_ids) < 400

    run(lambda: _with(body))


def test_worker_exception_reaches_every_waiting_caller() -> None:
    async def body(engine: AsyncEngine) -> None:
        runner = engine._worker.runner  # type: ignore[union-attr]
        real = runner.launch
        calls = {"n": 0}

        def flaky(*a: Any, **k: Any) -> Any:
            calls["n"] += 1
            if calls["n"] > 3:
                raise RuntimeError("device fell off the bus")
            return real(*a, **k)

        runner.launch = flaky
        tasks = [
            asyncio.create_task(engine.complete(f"Story number {i}:", SamplingParams(max_tokens=50)))
            for i in range(4)
        ]
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=60)
        assert all(isinstance(r, EngineDeadError) and "device fell off the bus" in str(r) for r in results)
        assert not engine.healthy
        with pytest.raises(EngineDeadError):
            await engine.complete("more", SamplingParams(max_tokens=1))

    async def main() -> None:
        engine = AsyncEngine(engine_config())
        await engine.start()
        try:
            await body(engine)
        finally:
            await engine.shutdown(drain=False)

    run(main)


async def _with(body: Any) -> None:
    async with AsyncEngine(engine_config()) as engine:
        await body(engine)


def test_complete_is_detokenized_at_the_end_with_the_streamed_text(engine: Engine, tokenizer: Any) -> None:
    """complete() (no listener, no stop string) decodes once at the end: the same text as streaming.

    Backpressure: a consumer that keeps up gets every token in its own output; one that
    reads late gets no new output built while its previous one is unread, so it reads
    fewer, larger ones (the quiet array path, and the full path with logprobs), every
    token, logprob and character still exactly once, in order."""
    prompt = "Écris une phrase avec des accents et un emoji 🎉 :"
    params = SamplingParams(temperature=0, max_tokens=8, skip_special_tokens=False)
    slow = SamplingParams(temperature=0, max_tokens=8, skip_special_tokens=False, n=2, logprobs=True)

    async def read_late() -> tuple[Any, list[Any], list[Any], list[Any]]:
        before = (await engine.engine.stats())["outputs"]
        agen, quiet = engine.engine.generate(prompt, slow), engine.engine.generate(prompt, params)
        first, q_first = await agen.__anext__(), await quiet.__anext__()
        done = await engine.engine.complete(prompt, params)  # nothing is read from agen and quiet meanwhile
        outs, quiet_outs = [first, *[o async for o in agen]], [q_first, *[o async for o in quiet]]
        # The worker built no output for a stream while its previous one was unread: it posted
        # what was read, but for each late completion's final, merged into its unread output.
        posted = (await engine.engine.stats())["outputs"] - before
        assert posted <= 1 + len(outs) + len(quiet_outs) + 3 < 3 * 8
        return done, await _read(engine.engine.generate(prompt, params)), outs, quiet_outs

    done, fast, outs, quiet_outs = engine.run(read_late())
    assert done.text == tokenizer.decode(list(done.token_ids), skip_special_tokens=False)
    # A reader that keeps up gets its first token at once (then one output per
    # stream_interval_ms at most: test_stream_interval_ms_groups_fast_tokens_and_keeps_every_one).
    assert len(fast[0].delta_token_ids) == 1
    assert len(outs) <= 4 < 2 * 8 and len(quiet_outs) <= 3 < 8
    for mine in ([o for o in outs if o.index == 0], [o for o in outs if o.index == 1], quiet_outs, fast):
        ids = [t for o in mine for t in o.delta_token_ids]
        assert mine[-1].finished and ids == list(mine[-1].token_ids) == list(done.token_ids)
        assert "".join(o.delta_text for o in mine) == mine[-1].text == done.text
        if mine is not quiet_outs and mine is not fast:
            assert [lp.token_id for o in mine for lp in o.delta_logprobs] == ids


async def _read(gen: Any) -> list[Any]:
    return [o async for o in gen]


def test_stream_interval_groups_tokens_and_keeps_every_one(tokenizer: Any, hf_model: Any) -> None:
    """`stream_interval=4`: the first token at once, then outputs of 4 tokens, the final one always;
    the held tokens, text and logprobs arrive in the next output, stop strings still cut."""
    with pytest.raises(ValueError, match="stream_interval"):
        engine_config(stream_interval=0)
    ids = tokenizer.encode("The quick brown fox")
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=True)

    async def body(engine: AsyncEngine) -> None:
        async def stream(params: SamplingParams) -> list[Any]:
            return [o async for o in engine.generate(ids, params)]

        full = await engine.complete(ids, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
        stop = full.text.split()[2]
        cut = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop=[stop])
        outs, cut_outs = await asyncio.gather(stream(greedy), stream(cut))
        assert list(full.token_ids) == hf_greedy(hf_model, ids, 10)
        # A reader that falls behind may get outputs merged, never split: sizes 1, 4, 4, ...
        assert all(len(o.token_ids) % 4 == 1 for o in outs[:-1]) and len(outs) <= 4
        assert (
            [t for o in outs for t in o.delta_token_ids] == list(outs[-1].token_ids) == list(full.token_ids)
        )
        assert [lp.token_id for o in outs for lp in o.delta_logprobs] == list(full.token_ids)
        assert "".join(o.delta_text for o in outs) == outs[-1].text == full.text
        assert cut_outs[-1].finish_reason == "stop" and cut_outs[-1].stop_reason == stop
        assert [t for o in cut_outs for t in o.delta_token_ids] == list(cut_outs[-1].token_ids)
        assert "".join(o.delta_text for o in cut_outs) == full.text[: full.text.index(stop)]

    run(with_engine, engine_config(stream_interval=4, stream_interval_ms=0), body)


def test_stream_interval_ms_groups_fast_tokens_and_keeps_every_one(tokenizer: Any, hf_model: Any) -> None:
    """`stream_interval_ms`: no streamed output sooner than that after the previous one; the first
    token goes at once and the final output always, carrying every token held in between. A
    gap longer than the whole request leaves exactly those two outputs; 0 streams every token."""
    for bad in (-1.0, float("inf"), True):
        with pytest.raises(ValueError, match="stream_interval_ms"):
            engine_config(stream_interval_ms=bad)
    ids = tokenizer.encode("The quick brown fox")
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=True)
    quiet = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = hf_greedy(hf_model, ids, 10)

    def check(outs: list[Any]) -> None:
        assert [t for o in outs for t in o.delta_token_ids] == list(outs[-1].token_ids) == ref
        assert "".join(o.delta_text for o in outs) == outs[-1].text == tokenizer.decode(ref)

    async def body(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
        outs, quiet_outs = await asyncio.gather(
            _read(engine.generate(ids, greedy)), _read(engine.generate(ids, quiet))
        )
        assert [lp.token_id for o in outs for lp in o.delta_logprobs] == ref
        return outs, quiet_outs

    for outs in run(with_engine, engine_config(stream_interval_ms=600_000), body):
        check(outs)  # the full path (logprobs) and the quiet array path alike
        assert len(outs) == 2 and len(outs[0].delta_token_ids) == 1 and outs[1].finished
    for outs in run(with_engine, engine_config(stream_interval_ms=0), body):
        check(outs)  # a reader that keeps up gets each token (a loaded machine may lag a step)
        assert len(outs) >= len(ref) - 2
