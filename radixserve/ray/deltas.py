"""What a replica's stream sends to the ingress over Ray: each output without the cumulative
fields (`text`, `token_ids`, `logprobs`), which the ingress rebuilds from the deltas. Sending
outputs whole would carry every token so far with every output: quadratic in a stream's length."""

from __future__ import annotations

from radixserve.outputs import RequestOutput, TokenLogprob, rewritten


def as_delta(out: RequestOutput) -> RequestOutput:
    """`out` with empty cumulative fields, its deltas kept (and no lazy reference to the request's
    token list, which pickling would copy whole)."""
    thin = rewritten(out, text="", token_ids=(), logprobs=())
    thin.__dict__.pop("_ids", None)
    return thin


class DeltaJoiner:
    """Rebuilds the cumulative fields of a request's outputs (n completions, told apart by
    `index`) from their deltas, in arrival order."""

    def __init__(self) -> None:
        self._so_far: dict[int, tuple[str, tuple[int, ...], tuple[TokenLogprob, ...]]] = {}

    def __call__(self, out: RequestOutput) -> RequestOutput:
        text, ids, lps = self._so_far.get(out.index, ("", (), ()))
        text, ids, lps = text + out.delta_text, ids + out.delta_token_ids, lps + out.delta_logprobs
        if out.finished:
            self._so_far.pop(out.index, None)
        else:
            self._so_far[out.index] = (text, ids, lps)
        return rewritten(out, text=text, token_ids=ids, logprobs=lps)
