"""Grammar steps of constrained requests: accept tokens, fill masks, jump forward.

The scheduler calls `accept` for each sampled token of a request with a
matcher (`req.grammar`), and `jump_forward` after it; the worker calls
`fill_bitmask` for a step's sampling rows right before that step samples,
once the previous step's tokens have been accepted (so both overlap modes
sample from the same mask).

Jump-forward: when the grammar forces a string after the last token (e.g.
`", "age": ` between two values), it is tokenized on its own and appended to
the output without a forward pass per token; the scheduler then extends those
tokens in one step, like a prefill chunk, sampling at its end. The forced text
is tokenized alone, not merged with the text before it: the tokens already
sampled (and possibly already streamed, their KV being computed by the step in
flight) stay, so at the boundary the ids can differ from what the tokenizer
would give the whole text (e.g. `"` + `name` instead of `"name`). The text is
the same and the grammar checks every forced token, so validity does not
change. In overlap mode the request already has a token in flight, sampled
from the mask before the jump: it is discarded (`req.discard`), so a jump of m
tokens saves m - 1 forward passes there (m without overlap); jumps of one
token are skipped when a token is in flight, since they would save nothing.
On the CPU, where launch() runs a step before it returns and overlap hides
nothing, the scheduler instead processes the step in flight before building
one with a jump-forward request in it (`SchedulerConfig.hold_for_jumps`), so
no token is discarded there.

Two more forced pieces: the text forced before the first token (`{"name": "`)
is appended when the request is added and prefilled with the prompt, and
where the grammar then allows only its stop token (after the closing `}`),
that token is appended too and the request ends without a pass to sample it
(greedy or not, the sampler could pick nothing else).
"""

from __future__ import annotations

import torch

from radixserve.constrained.base import GrammarBackend, Matcher
from radixserve.model.text_tokenizer import TokenizerLike
from radixserve.sched.request import Request


def _matcher(req: Request) -> Matcher:
    assert req.grammar is not None, "a grammar step of a request without a grammar"
    return req.grammar


def accept(req: Request, tok: int) -> tuple[str | None, str | int | None, str | None]:
    """Accept `tok` into the matcher: (finish_reason, stop_reason, error) or all None."""
    m = _matcher(req)
    if not m.accept_token(tok):
        # Only reachable when something else ruled out every allowed token (e.g. min_tokens
        # suppressing the EOS the grammar requires): fail this request, not the engine.
        return "abort", None, f"the grammar rejected token {tok} (no allowed token was left)"
    if m.is_terminated():
        return "stop", tok, None
    return None, None, None


def wants_jump(req: Request, default: bool) -> bool:
    """Jump-forward for this request: its own `jump_forward`, or the device's default when None."""
    p = req.params
    return p.use_jump_forward and (p.jump_forward is not None or default)


def jump_forward(
    req: Request, tokenizer: TokenizerLike | None, default: bool, room: int | None = None
) -> list[int]:
    """Append the forced string's tokens (accepted by the matcher); [] when there is none.

    Where the grammar then allows only its stop token (a complete JSON object), that
    token is forced too, so the request ends without a pass that could only sample it.
    That part needs no extend step, so it is on wherever jump-forward is allowed; the
    forced text follows `default` when the request leaves `jump_forward` at None."""
    if tokenizer is None or not req.params.use_jump_forward:
        return []
    # The in-flight token (if any) is replaced, so its place counts as free.
    room = req.remaining_tokens + req.pending if room is None else room
    if room <= 0:
        return []
    m = _matcher(req)
    forced = m.forced_string() if wants_jump(req, default) else ""
    ids = list(tokenizer.encode(forced, add_special_tokens=False))[:room] if forced else []
    taken = 0
    for t in ids:
        if not m.accept_token(t):
            break
        taken += 1
    ids = ids[:taken]
    # A stop alone with a token in flight would save nothing: skip its row fill (regex
    # grammars are complete after many tokens).
    if taken < room and (taken or not req.pending) and _may_stop(req, taken):
        stop = m.forced_stop()
        if stop is not None and stop in req.eos_ids and m.accept_token(stop):
            ids.append(stop)
    if len(ids) < (2 if req.pending else 1):
        m.rollback(len(ids))
        return []
    if req.pending:  # the step in flight samples a token that the jump replaces
        req.pending -= 1
        req.discard += 1
        req.jump_discarded += 1
    req.jump_tokens += len(ids)
    return ids


def _may_stop(req: Request, forced: int) -> bool:
    # The sampler would mask the stop token (min_tokens) or not stop on it (ignore_eos).
    p = req.params
    return not p.ignore_eos and len(req.output_ids) + forced >= p.min_tokens


def fill_bitmask(reqs: list[Request], backend: GrammarBackend) -> tuple[torch.Tensor, list[int]] | None:
    """The bitmask of one step's sampling requests and the rows it constrains, or None.

    Finished requests and those whose in-flight token will be discarded keep
    an all-allowed row: their token is dropped anyway."""
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None and not r.finished and not r.discard]
    if not rows:
        return None
    bitmask = backend.allocate_bitmask(len(reqs))
    backend.fill_bitmasks([_matcher(reqs[i]) for i in rows], bitmask, rows)
    return bitmask, rows


def jump_at_start(req: Request, tokenizer: TokenizerLike | None) -> int:
    """What the grammar forces before the first token (`{"name": "`) goes in with the
    prompt; returns how many tokens that is."""
    room = req.remaining_tokens - 1  # the prefill samples at least one token
    # Prefilled with the prompt, it needs no step of its own: on whatever the device.
    forced = jump_forward(req, tokenizer, True, room)
    if forced and forced[-1] in req.eos_ids:  # a one-string grammar: the sampler ends it
        _matcher(req).rollback(1)
        req.jump_tokens -= 1
        forced.pop()
    if not forced:
        return 0
    req.output_ids.extend(forced)  # the first output's delta_token_ids carry them
    if req.detok is not None:
        req.detok.add(forced)
    return len(forced)
