"""SGLang's `/generate` answer from a `RequestOutput`: `text`, `output_ids` and `meta_info`.

meta_info as SGLang's tokenizer manager builds it: `id`, `finish_reason`
(`{"type": "stop", "matched": str | id}`, `{"type": "length", "length": n}`,
`{"type": "abort", "message": ...}` or None while running), `prompt_tokens`,
`completion_tokens`, `cached_tokens`, `e2e_latency` when finished and, with
`return_logprob`, `input_token_logprobs` / `output_token_logprobs` as
`(logprob, token id, text or None)` plus `input_top_logprobs` /
`output_top_logprobs` (a list of such triples per position) when
`top_logprobs_num > 0`. As in SGLang, the prompt token at `logprob_start_len`
has no logprob (None): it is the first one the model sees from there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from radixserve.outputs import RequestOutput, TokenLogprob
from radixserve.server.native_protocol import Item

Triple = tuple[float | None, int, str | None]


class TokenTexts:
    """Each token id's own text (SGLang decodes them one by one), decoded once."""

    def __init__(self, tokenizer: Any, enabled: bool) -> None:
        self.tok = tokenizer if enabled else None
        self._cache: dict[int, str] = {}

    def __call__(self, tid: int) -> str | None:
        if self.tok is None:
            return None
        text = self._cache.get(tid)
        if text is None:
            text = self._cache[tid] = str(self.tok.decode([tid]))
        return text


def finish_reason(out: RequestOutput) -> dict[str, Any] | None:
    if not out.finished:
        return None
    if out.finish_reason == "stop":
        return {"type": "stop", "matched": out.stop_reason}
    if out.finish_reason == "length":
        return {"type": "length", "length": len(out.token_ids)}
    return {"type": "abort", "message": out.error or "aborted", "status_code": None, "err_type": None}


class MetaBuilder:
    """Builds one completion's answers; keeps converted logprobs so each chunk adds only new ones."""

    def __init__(self, item: Item, prompt_ids: Sequence[int], output_id: str, texts: TokenTexts) -> None:
        self.item = item
        self.prompt_ids = prompt_ids
        self.id = output_id
        self.texts = texts
        self.started = time.perf_counter()
        self._out: list[Triple] = []
        self._out_top: list[list[Triple] | None] = []
        self._in: list[Triple] | None = None
        self._in_top: list[list[Triple] | None] | None = None

    def _triple(self, lp: float | None, tid: int) -> Triple:
        return (lp, tid, self.texts(tid))

    def _top(self, tl: TokenLogprob) -> list[Triple] | None:
        return [self._triple(lp, t) for t, lp in tl.top] or None

    def _input(self, out: RequestOutput) -> None:
        start = self.item.logprob_start_len
        if self._in is not None or start < 0:
            return
        if start >= len(self.prompt_ids):
            self._in, self._in_top = [], []
            return
        if len(out.prompt_logprobs) < len(self.prompt_ids) - start - 1:
            return  # not computed yet (a chunked prefill still running)
        self._in = [self._triple(None, self.prompt_ids[start])]
        self._in += [self._triple(tl.logprob, tl.token_id) for tl in out.prompt_logprobs]
        first: list[list[Triple] | None] = [None]
        self._in_top = first + [self._top(tl) for tl in out.prompt_logprobs]

    def answer(self, out: RequestOutput, index: int | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.id,
            "finish_reason": finish_reason(out),
            "prompt_tokens": out.usage.prompt_tokens,
            "completion_tokens": out.usage.completion_tokens,
            "cached_tokens": out.usage.cached_tokens,
        }
        if self.item.return_logprob:
            self._input(out)
            for tl in out.logprobs[len(self._out) :]:
                self._out.append(self._triple(tl.logprob, tl.token_id))
                self._out_top.append(self._top(tl))
            meta["input_token_logprobs"] = list(self._in or [])
            meta["output_token_logprobs"] = list(self._out)
            meta["output_token_logprobs_length"] = len(self._out)
            if self.item.top_logprobs_num > 0:
                meta["input_top_logprobs"] = list(self._in_top or [])
                meta["output_top_logprobs"] = list(self._out_top)
        if out.finished:
            meta["e2e_latency"] = time.perf_counter() - self.started
        answer: dict[str, Any] = {"text": out.text, "output_ids": list(out.token_ids), "meta_info": meta}
        if index is not None:
            answer["index"] = index
        return answer
