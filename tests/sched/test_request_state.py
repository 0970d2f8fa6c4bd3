"""`Request.can_decode` (the decode step's one-pass filter) says what its three properties say."""

from __future__ import annotations

import itertools

from radixserve.outputs import TokenLogprob
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


def test_the_chunk_scoring_at_most_rows_is_the_longest_that_does() -> None:
    """Against brute force: for every start, chunk length, row budget and logprob start, the
    chunk `chunk_scoring_at_most` allows scores at most the rows, and one token more would
    score more (unless it is the whole chunk asked for)."""
    for lp_start, done in itertools.product((0, 1, 4, 9), (0, 2)):
        params = SamplingParams(prompt_logprobs=True, prompt_logprobs_start=lp_start)
        r = Request("r", 0, list(range(12)), params, frozenset(), 64)
        r.prompt_logprobs = [TokenLogprob(0, 0.0, ())] * done  # scored before a retraction
        for start, n, rows in itertools.product(range(12), range(1, 13), range(4)):
            m = r.chunk_scoring_at_most(start, n, rows)
            assert 0 <= m <= n and len(r.scored_positions(start, m)) <= rows
            assert m == n or len(r.scored_positions(start, m + 1)) > rows, (lp_start, done, start, n, rows)
    plain = Request("p", 0, list(range(12)), SamplingParams(), frozenset(), 64)
    assert plain.chunk_scoring_at_most(0, 12, 0) == 12 and not plain.scored_positions(0, 12)
