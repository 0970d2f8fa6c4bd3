"""Lazy detokenization (nobody streams, no stop strings) gives the eager, incremental text."""

from __future__ import annotations

import random

from transformers import AutoTokenizer

from radixserve.model.embedded import embedded_model_dir
from radixserve.sched.detokenizer import Detokenizer


def test_lazy_text_equals_incremental_text() -> None:
    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    rng = random.Random(0)
    # Multi-byte characters split across tokens, specials, and random ids.
    texts = ["héllo wörld 世界 🎉🎉 naïve café", "<|im_start|>user\nHi 👋<|im_end|>", "  spaced\n\ttabs  "]
    seqs = [tok.encode(t) for t in texts] + [[rng.randrange(tok.vocab_size) for _ in range(40)]]
    for ids in seqs:
        for skip in (True, False):
            eager = Detokenizer(tok, (), False, skip)
            lazy = Detokenizer(tok, (), False, skip, lazy=True)
            streamed = ""
            for i in range(0, len(ids), 3):  # eager: tokens arrive a few at a time and are flushed
                eager.add(ids[i : i + 3])
                lazy.add(ids[i : i + 3])
                streamed += eager.flush(False)
            assert lazy.text == ""  # nothing decoded before the text is asked for
            eager.final_text()
            streamed += eager.flush(True)
            assert lazy.final_text() == eager.text == streamed
            assert lazy.flush(True) == streamed


def test_stop_strings_keep_a_lazy_request_incremental() -> None:
    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    d = Detokenizer(tok, ("world",), False, True, lazy=True)
    assert not d.lazy
    d.add(tok.encode("hello world and more"))
    assert d.stopped_by == "world" and d.text == "hello "


class _PlainDecode:
    """A tokenizer seen only through its `decode`: the Python windows, not DecodeStream."""

    def __init__(self, tok: object) -> None:
        self.decode = tok.decode  # type: ignore[attr-defined]


def test_decode_stream_gives_the_python_windows_text() -> None:
    from radixserve.model.loader import load_model
    from radixserve.sched.detokenizer import stream_backend

    hf = AutoTokenizer.from_pretrained(embedded_model_dir())
    ours = load_model("smollm2-135m-instruct").tokenizer  # radixserve's own TextTokenizer
    rng = random.Random(1)
    texts = [
        "héllo wörld 世界 🎉🎉 naïve café",
        "<|im_start|>user\nHi 👋<|im_end|>",
        "a\u0301\u0302 ﬁ ẞ\n\n  x",
    ]
    for tok in (hf, ours):
        assert stream_backend(tok) is not None, type(tok)  # the fast path is what runs
        seqs = [tok.encode(t) for t in texts] + [[rng.randrange(tok.vocab_size) for _ in range(60)]]
        for ids in seqs:
            for skip in (True, False):
                fast, plain = (
                    Detokenizer(tok, (), False, skip),
                    Detokenizer(_PlainDecode(tok), (), False, skip),
                )
                pieces: list[tuple[str, str]] = []
                for t in ids:
                    fast.add([t])
                    plain.add([t])
                    pieces.append((fast.flush(False), plain.flush(False)))
                assert all(a == b for a, b in pieces), (type(tok), ids)
                assert fast.final_text() == plain.final_text()
                assert fast.text == tok.decode(ids, skip_special_tokens=skip) or ids == seqs[-1]


class _RefusesAt:
    """A DecodeStream that decodes as the real one until token `k`, then refuses (raises), as
    `tokenizers` does for a decoder that rewrote text it already returned."""

    def __init__(self, real: object, k: int) -> None:
        self.real, self.k, self.n = real, k, 0

    def step(self, backend: object, token: int) -> str | None:
        if self.n == self.k:
            raise RuntimeError("refused")
        self.n += 1
        return self.real.step(backend, token)  # type: ignore[attr-defined,no-any-return]


def test_a_refused_decode_stream_hands_over_to_the_python_windows() -> None:
    """Lazy or incremental, a request whose DecodeStream refuses a token gets the text of the
    Python windows from that token on: the same text as a request decoded by them throughout."""
    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    rng = random.Random(2)
    seqs = [tok.encode("héllo wörld 世界 🎉🎉 naïve café, again and again")]
    seqs += [[rng.randrange(tok.vocab_size) for _ in range(40)]]
    for ids in seqs:
        plain = Detokenizer(_PlainDecode(tok), (), False, True)
        want = []  # what a reader gets after each token
        for t in ids:
            plain.add([t])
            want.append(plain.flush(False))
        for k in (0, 1, 5, len(ids) // 2, len(ids) - 1):
            lazy, eager = Detokenizer(tok, (), False, True, lazy=True), Detokenizer(tok, (), False, True)
            for d in (lazy, eager):
                assert d._stream is not None  # the fast path is what runs
                d._stream = _RefusesAt(d._stream, k)  # type: ignore[assignment]
            got = []
            for t in ids:
                eager.add([t])
                got.append(eager.flush(False))
            lazy.add(ids)
            assert got == want, (k, ids)
            assert lazy.flush(False) == "".join(want)  # the lazy text, decoded at once when asked
            assert lazy.final_text() == eager.final_text() == plain.final_text(), (k, ids)
            assert lazy._stream is None and eager._stream is None
