"""From sampled tokens to what the caller sees: stop rules and `RequestOutput`s.

Pure functions of one request's state, so the scheduler's `process` stays a
loop over the batch. The request's `Detokenizer` (`req.detok`) turns ids into
text incrementally and matches stop strings.
"""

from __future__ import annotations

from radixserve.outputs import RequestOutput, TokenLogprob, new_output, new_usage
from radixserve.sched.request import Request


def stop_rule(req: Request, tok: int) -> tuple[str | None, str | int | None]:
    """(finish_reason, stop_reason) after `tok` was appended, or (None, None) to go on."""
    p = req.params
    n_out = len(req.output_ids)
    # EOS and stop ids cannot appear before min_tokens: the sampler masks them until then.
    if (not p.ignore_eos and tok in req.eos_ids) or tok in p.stop_token_ids:
        return "stop", tok
    if req.detok is not None and req.detok.stopped_by is not None:
        return "stop", req.detok.stopped_by
    if n_out >= p.max_tokens or req.num_tokens >= req.max_context:
        return "length", None
    return None, None


def stream_due(req: Request, now: float) -> bool:
    """Whether a streamed request that is still running gets an output now (`now`:
    `time.monotonic()`): its first at once, then once `stream_every` tokens and
    `stream_gap` seconds have passed since the previous one. Held tokens ride in the next."""
    if not req.sent_tokens:
        return True
    return len(req.output_ids) - req.sent_tokens >= req.stream_every and now >= req.next_output_at


def streamed_output(req: Request, lp: TokenLogprob | None, now: float) -> RequestOutput:
    """A running request's streamed output; the next one is due `stream_gap` seconds later."""
    out = make_output(req, lp, final=False)
    req.next_output_at = now + req.stream_gap
    return out


def make_output(req: Request, lp: TokenLogprob | None, final: bool) -> RequestOutput:
    """An output of `req` (`lp`: its last token's logprob, if asked): the tokens, logprobs
    and text since its previous output, and everything so far."""
    if lp is not None:
        req.logprobs.append(lp)
    ids, lps = req.output_ids, req.logprobs
    new = ids[req.sent_tokens :]
    delta_lps = tuple(lps[req.sent_logprobs :]) if lps else ()
    req.sent_tokens, req.sent_logprobs = len(ids), len(lps)
    detok = req.detok
    text = delta = ""
    if detok is not None:
        if final:
            detok.final_text()
        delta = detok.flush(final)
        text = detok.text[: detok.emitted]
    return new_output(
        req.rid,
        req.index,
        delta,
        tuple(new),
        text,
        ids,  # copied when read (`RequestOutput.token_ids`): no O(n) copy per output
        final,
        req.finish_reason if final else None,
        new_usage(len(req.prompt_ids), len(req.output_ids), req.cached_tokens, req.jump_tokens),
        req.stop_reason if final else None,
        tuple(lps) if lps else (),
        delta_lps,
        tuple(req.prompt_logprobs) if req.prompt_logprobs else (),
        req.error if final else None,
    )
