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
"""

from __future__ import annotations

from typing import Any

import torch

from radixserve.sched.request import Request


def accept(req: Request, tok: int) -> tuple[str | None, str | int | None, str | None]:
    """Accept `tok` into the matcher: (finish_reason, stop_reason, error) or all None."""
    if not req.grammar.accept_token(tok):
        # Only reachable when something else ruled out every allowed token (e.g. min_tokens
        # suppressing the EOS the grammar requires): fail this request, not the engine.
        return "abort", None, f"the grammar rejected token {tok} (no allowed token was left)"
    if req.grammar.is_terminated():
        return "stop", tok, None
    return None, None, None


def jump_forward(req: Request, tokenizer: Any) -> list[int]:
    """Append the forced string's tokens (accepted by the matcher); [] when there is none."""
    if tokenizer is None or not req.params.use_jump_forward:
        return []
    forced = req.grammar.forced_string()
    if not forced:
        return []
    # The in-flight token (if any) is replaced, so its place counts as free.
    ids = list(tokenizer.encode(forced, add_special_tokens=False))[: req.remaining_tokens + req.pending]
    taken = 0
    for t in ids:
        if not req.grammar.accept_token(t):
            break
        taken += 1
    if taken < (2 if req.pending else 1):
        req.grammar.rollback(taken)
        return []
    ids = ids[:taken]
    if req.pending:  # the step in flight samples a token that the jump replaces
        req.pending -= 1
        req.discard += 1
        req.jump_discarded += 1
    req.jumped = True
    req.jump_tokens += len(ids)
    return ids


def fill_bitmask(reqs: list[Request], backend: Any) -> tuple[torch.Tensor, list[int]] | None:
    """The bitmask of one step's sampling requests and the rows it constrains, or None.

    Finished requests and those whose in-flight token will be discarded keep
    an all-allowed row: their token is dropped anyway."""
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None and not r.finished and not r.discard]
    if not rows:
        return None
    bitmask = backend.allocate_bitmask(len(reqs))
    backend.fill_bitmasks([reqs[i].grammar for i in rows], bitmask, rows)
    return bitmask, rows
