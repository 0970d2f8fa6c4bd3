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


def make_output(req: Request, new: list[int], lp: TokenLogprob | None, final: bool) -> RequestOutput:
    """The output of this step: the new tokens and text (with those held since the last
    output), and everything so far."""
    delta_lps: tuple[TokenLogprob, ...] = ()
    if lp is not None:
        req.logprobs.append(lp)
        delta_lps = (lp,)
    if req.unsent:
        new = req.unsent + new
        delta_lps = (*req.unsent_logprobs, *delta_lps)
        req.unsent, req.unsent_logprobs = [], []
    req.streamed = True
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
        tuple(req.output_ids),
        final,
        req.finish_reason if final else None,
        new_usage(len(req.prompt_ids), len(req.output_ids), req.cached_tokens, req.jump_tokens),
        req.stop_reason if final else None,
        tuple(req.logprobs) if req.logprobs else (),
        delta_lps,
        tuple(req.prompt_logprobs) if req.prompt_logprobs else (),
        req.error if final else None,
    )
