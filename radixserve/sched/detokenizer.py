"""Incremental detokenization and stop-string matching for one request.

Decoding each new token alone breaks multi-byte characters and merges
(SentencePiece spaces, byte-level BPE), so text is decoded over a short
window of recent tokens and only the part that grew is emitted, the way
vLLM and text-generation-inference do it. Text that could still become a stop
string is held back until it is known not to be one, so a stop string never
leaks into the stream.

Where the tokenizer's `decode` is its `tokenizers.Tokenizer`'s decode alone
(`stream_backend`: ours, or transformers' fast tokenizer without clean-up), the
same windowed algorithm runs in Rust (`tokenizers.decoders.DecodeStream`,
~2 µs a token against ~15 for two Python decodes on a 2-core machine). Its
windows follow the same offsets as the Python path's, which takes over for
the rest of the request if DecodeStream refuses a step (a decoder that
rewrites earlier text).

A request nobody streams and without stop strings is `lazy`: `add` only
records the ids, and the same window-by-window decoding runs when the text
is first asked for (its final output), so the text is the same and the
worker does no tokenizer work per step for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from radixserve.model.text_tokenizer import TokenizerLike


def stream_backend(tok: TokenizerLike) -> Tokenizer | None:
    """The `tokenizers.Tokenizer` whose decode is exactly `tok.decode`, else None."""
    from radixserve.model.text_tokenizer import TextTokenizer

    if isinstance(tok, TextTokenizer):  # decodes plain id lists with its backend, nothing else
        return tok.backend_tokenizer
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    if not isinstance(tok, TokenizersBackend) or getattr(tok, "clean_up_tokenization_spaces", True):
        return None
    cls = type(tok)
    if cls._decode is not TokenizersBackend._decode or cls.decode is not TokenizersBackend.decode:
        return None  # a subclass that decodes its own way
    backend = getattr(tok, "_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class Detokenizer:
    def __init__(
        self,
        tokenizer: TokenizerLike | None,
        stop: tuple[str, ...],
        include_stop: bool,
        skip_special: bool,
        lazy: bool = False,
        ids: list[int] | None = None,
    ) -> None:
        """`lazy`: nobody reads the text before the end; ignored when there are stop strings.
        `ids` (lazy only): the caller's list of output ids, which it appends to itself;
        `add` then records nothing (the scheduler passes the request's `output_ids`)."""
        self.tok = tokenizer
        self.lazy = lazy and not stop
        self._shared = self.lazy and ids is not None
        self._done = 0  # ids[:_done] are decoded into text
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special = skip_special
        self.ids: list[int] = ids if self._shared and ids is not None else []
        self.text = ""  # everything decoded so far (may include held-back text)
        self.emitted = 0  # chars of self.text already handed to the caller
        self._prefix_offset = 0
        self._read_offset = 0
        self.stopped_by: str | None = None
        self._backend = stream_backend(tokenizer) if tokenizer is not None else None
        self._stream = DecodeStream(skip_special_tokens=skip_special) if self._backend is not None else None

    def _decode(self, ids: list[int]) -> str:
        assert self.tok is not None  # callers return early without a tokenizer
        return self.tok.decode(ids, skip_special_tokens=self.skip_special)

    def add(self, token_ids: list[int]) -> None:
        """Append tokens; afterwards check `stopped_by` and take `flush()`."""
        if self.tok is None:
            return
        if self.lazy:
            if not self._shared:
                self.ids.extend(token_ids)
            return
        for t in token_ids:
            if self.stopped_by is not None:
                return
            self.ids.append(t)
            self._catch_up()

    def _catch_up(self) -> None:
        """Decode the ids not decoded yet, one token at a time (a model without a tokenizer has no text)."""
        if self.tok is None:
            return
        if self._stream is not None and not self.stop:
            self._catch_up_stream()
            if self._stream is not None:
                return
            # DecodeStream refused a token: the Python windows go on from it, below.
        while self._done < len(self.ids):
            self._done += 1
            new = self._step_stream() if self._stream is not None else None
            if new is None and self._stream is None:
                prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
                full = self._decode(self.ids[self._prefix_offset : self._done])
                if len(full) > len(prefix) and not full.endswith("\ufffd"):
                    new = full[len(prefix) :]
            if new:
                start = len(self.text)
                self.text += new
                self._prefix_offset = self._read_offset
                self._read_offset = self._done
                self._check_stop(start)

    def _catch_up_stream(self) -> None:
        """`_catch_up`'s steps while DecodeStream decodes and no stop string is watched (a
        lazy request's whole output at its end): the same offsets and text, in locals."""
        assert self._stream is not None and self._backend is not None
        ids, step, backend = self.ids, self._stream.step, self._backend
        done, prefix, read = self._done, self._prefix_offset, self._read_offset
        pieces: list[str] = []
        try:
            for t in ids[done:]:
                new = step(backend, t)
                done += 1
                if new:
                    pieces.append(new)
                    prefix, read = read, done
        except Exception:  # noqa: BLE001 - as in `_step_stream`: token `done` goes to the windows
            self._stream = None
        if pieces:
            self.text += "".join(pieces)
        self._done, self._prefix_offset, self._read_offset = done, prefix, read

    def _step_stream(self) -> str | None:
        """DecodeStream's step for token `_done - 1`; on its refusal the Python windows take
        over from the same offsets, this token first."""
        assert self._stream is not None and self._backend is not None
        try:
            return self._stream.step(self._backend, self.ids[self._done - 1])
        except Exception:  # noqa: BLE001 - e.g. a decoder that rewrote earlier text
            self._stream = None
            return None

    def _check_stop(self, new_from: int) -> None:
        for s in self.stop:
            # A match can begin up to len(s)-1 chars before the new text.
            at = self.text.find(s, max(0, new_from - len(s) + 1))
            if at >= 0:
                self.stopped_by = s
                self.text = self.text[: at + len(s)] if self.include_stop else self.text[:at]
                return

    def flush(self, final: bool) -> str:
        """New text for the caller; while running, hold back a possible stop prefix."""
        if self.lazy:
            self._catch_up()
        end = len(self.text)
        if not final and self.stopped_by is None and self.stop:
            end -= self._held_back()
        end = max(end, self.emitted)
        out = self.text[self.emitted : end]
        self.emitted = end
        return out

    def final_text(self) -> str:
        if self.tok is None:
            return ""
        self._catch_up()
        # Tokens still waiting for a complete character are decoded as they are.
        if self.stopped_by is None and self._read_offset < len(self.ids):
            tail = self._decode(self.ids[self._prefix_offset :])
            head = self._decode(self.ids[self._prefix_offset : self._read_offset])
            self.text += tail[len(head) :]
            self._read_offset = len(self.ids)
            self._check_stop(len(self.text) - len(tail[len(head) :]))
        return self.text

    def _held_back(self) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
