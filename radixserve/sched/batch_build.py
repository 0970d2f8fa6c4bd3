"""Batch building: the scheduler's picks for one step, turned into a `Batch`.

The scheduler decides who runs and has allocated their slots (written into
the request-to-slot table); these functions only lay the step out on the
host and mark its tokens as computed or in flight (`advance`):

- `decode`: one token per request, the hot case, built without per-token work.
- `extend`: any number of tokens per request (prefill chunks, decode rows
  beside them, forced tokens of jump-forward), with prompt-logprob rows.
"""

from __future__ import annotations

import numpy as np

from radixserve.runtime.sampler import SamplingInputs
from radixserve.sched.batch import Batch
from radixserve.sched.request import Request
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.sampling_rows import SamplingRows


def decode(kv: RequestKV, srows: SamplingRows, reqs: list[Request], slots: np.ndarray) -> Batch:
    """One token per request: the hot case, O(batch) host work whatever the context.

    `slots` (one each, freshly allocated) go into the host table here; the
    runner writes them into the device table and gathers the context slots
    there (runtime/decode_inputs.py), so the batch carries no `kv_indices`."""
    n = len(reqs)
    rows = np.fromiter((r.row for r in reqs), np.int64, n)
    kv_lens = [r.kv_len for r in reqs]
    kv.slots[rows, kv_lens] = slots
    # The input is the last known token, or -1 when it is still being sampled.
    input_ids = np.fromiter(
        (
            (r.output_ids[-1] if r.output_ids else r.prompt_ids[-1]) if k < r.num_known else -1
            for r, k in zip(reqs, kv_lens)
        ),
        np.int64,
        n,
    )
    return decode_batch(reqs, rows, kv_lens, input_ids, slots, srows.inputs(reqs, rows), srows)


def decode_batch(
    reqs: list[Request],
    rows: np.ndarray,
    kv_lens: list[int],
    input_ids: np.ndarray,
    slots: np.ndarray,
    sampling: SamplingInputs,
    srows: SamplingRows,
) -> Batch:
    """A decode step's `Batch` (its slots already in the table), its tokens advanced: the
    layout shared by `decode` and the steady set (sched/steady.py)."""
    n = len(reqs)
    batch = Batch(
        reqs=reqs,
        extend_lens=[1] * n,
        prefix_lens=kv_lens,
        input_ids=input_ids,
        out_slots=slots.astype(np.int64),
        kv_indices=None,
        sample=[True] * n,
        sampling=sampling,
        is_prefill=False,
        rows=rows,
        quiet=srows.quiet[rows],  # copies: the rows may change hands before process()
        stop_ids=srows.stop_ids[rows],
    )
    for r in reqs:  # advance() for one sampled token each
        r.kv_len += 1
        r.pending += 1
    return batch


def extend(kv: RequestKV, srows: SamplingRows, picked: list[tuple[Request, int]]) -> Batch:
    """`picked`: (request, new tokens); their slots are already in the table."""
    input_ids: list[int] = []
    lp_rows: list[list[int]] = []
    lp_targets: list[int] = []
    sample: list[bool] = []
    prefix_lens, extend_lens, ctx, out = [], [], [], []
    for req, n in picked:
        start = req.kv_len
        if start + n <= req.num_known:
            input_ids.extend(req.known_ids(start, start + n))
        else:  # decode of a token still in flight
            input_ids.append(-1)
        rows: list[int] = []
        if req.params.prompt_logprobs:
            # Positions scored before a retraction are not scored again on readmission.
            first = max(req.params.prompt_logprobs_start, 1) + len(req.prompt_logprobs)
            for p in range(max(first, start + 1), min(start + n, len(req.prompt_ids) - 1) + 1):
                rows.append(len(input_ids) - n + (p - 1 - start))
                lp_targets.append(req.prompt_ids[p])
        lp_rows.append(rows)
        prefix_lens.append(start)
        extend_lens.append(n)
        row_slots = kv.slots[req.row]
        ctx.append(row_slots[: start + n])
        out.append(row_slots[start : start + n])
        # Only a request whose part reaches its last token samples (not a chunk with more to come).
        sample.append(start + n >= req.num_tokens and req.params.max_tokens > 0 and req.remaining_tokens > 0)
    batch = Batch(
        reqs=[r for r, _ in picked],
        extend_lens=extend_lens,
        prefix_lens=prefix_lens,
        input_ids=input_ids,
        out_slots=np.concatenate(out).astype(np.int64),
        kv_indices=np.concatenate(ctx),
        sample=sample,
        sampling=srows.inputs([r for (r, _), s in zip(picked, sample) if s]),
        prompt_lp_rows=lp_rows,
        prompt_lp_targets=lp_targets,
        is_prefill=True,
    )
    advance(picked, sample)
    return batch


def advance(picked: list[tuple[Request, int]], sample: list[bool]) -> None:
    """The batch is built: its tokens now count as computed (or in flight)."""
    for (req, n), s in zip(picked, sample):
        req.kv_len += n
        req.pending += int(s)
