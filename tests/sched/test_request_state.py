"""`Request.can_decode` (the decode step's one-pass filter) says what its three properties say."""

from __future__ import annotations

import itertools

from radixserve.sampling_params import SamplingParams
from radixserve.sched.request import Request


def test_can_decode_equals_prefill_done_last_token_and_remaining() -> None:
    grid = itertools.product(range(7), (1, 3), range(3), range(2), (0, 1, 2, 4), (4, 6, 9))
    for kv, n_prompt, n_out, pending, max_tokens, max_context in grid:
        r = Request(
            "r", 0, list(range(n_prompt)), SamplingParams(max_tokens=max_tokens), frozenset(), max_context
        )
        r.kv_len, r.output_ids, r.pending = kv, list(range(n_out)), pending
        want = r.prefill_done and r.kv_len == r.num_tokens - 1 and r.remaining_tokens > 0
        assert r.can_decode == want, (kv, n_prompt, n_out, pending, max_tokens, max_context)
