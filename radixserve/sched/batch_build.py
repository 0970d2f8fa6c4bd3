"""Batch building: the scheduler's picks for one step, turned into a `Batch`.

The scheduler decides who runs and has allocated their slots (written into
the request-to-slot table); these functions only lay the step out on the
host (the step's one form, `StepInput`, and what processing its result
needs) and mark its tokens as computed or in flight:

- `decode_batch`: one token per request, the hot case, from row arrays (the
  steady set's, sched/steady.py, or `decode`'s, which asks each request);
  no `kv_indices`: the runner gathers the context on the device.
- `extend`: any number of tokens per request (prefill chunks, decode rows
  beside them, forced tokens of jump-forward), with prompt-logprob rows and
  the context slots listed on the host.
"""

from __future__ import annotations

import numpy as np

from radixserve.runtime.cascade import CascadeGroups
from radixserve.runtime.sampler import SamplingInputs
from radixserve.runtime.step import StepInput
from radixserve.sched.batch import Batch
from radixserve.sched.request import Request
from radixserve.sched.request_kv import RequestKV
from radixserve.sched.sampling_rows import SamplingRows


def decode(
    kv: RequestKV, srows: SamplingRows, reqs: list[Request], slots: np.ndarray, cascade: CascadeGroups | None
) -> Batch:
    """One token per request: the hot case, O(batch) host work whatever the context.

    `slots` (one each, freshly allocated) go into the host table here; the
    runner writes them into the device table and gathers the context slots
    there (runtime/step_batch.py), so the batch carries no `kv_indices`."""
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
    kv_lens_a = np.asarray(kv_lens, dtype=np.int64)
    return decode_batch(reqs, rows, kv_lens_a, input_ids, slots, srows.inputs(reqs, rows), srows, cascade)


def decode_batch(
    reqs: list[Request],
    rows: np.ndarray,
    kv_lens: np.ndarray,
    input_ids: np.ndarray,
    slots: np.ndarray,
    sampling: SamplingInputs,
    srows: SamplingRows,
    cascade: CascadeGroups | None,
) -> Batch:
    """A decode step's `Batch` (its slots already in the table), its tokens advanced: the
    layout shared by `decode` and the steady set (sched/steady.py)."""
    n = len(reqs)
    step = StepInput.decode(rows, kv_lens, slots.astype(np.int64), input_ids, sampling, cascade)
    batch = Batch(
        reqs=reqs,
        step=step,
        sample=[True] * n,
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
    lp_counts: list[int] = []
    lp_rows: list[int] = []
    lp_targets: list[int] = []
    sample: list[bool] = []
    sample_rows: list[int] = []
    prefix_lens, extend_lens, ctx, out = [], [], [], []
    for req, n in picked:
        start = req.kv_len
        if start + n <= req.num_known:
            input_ids.extend(req.known_ids(start, start + n))
        else:  # decode of a token still in flight
            input_ids.append(-1)
        before = len(lp_rows)
        for p in req.scored_positions(start, n):
            lp_rows.append(len(input_ids) - n + (p - 1 - start))
            lp_targets.append(req.prompt_ids[p])
        lp_counts.append(len(lp_rows) - before)
        prefix_lens.append(start)
        extend_lens.append(n)
        row_slots = kv.slots[req.row]
        ctx.append(row_slots[: start + n])
        out.append(row_slots[start : start + n])
        # Only a request whose part reaches its last token samples (not a chunk with more to come).
        sample.append(start + n >= req.num_tokens and req.params.max_tokens > 0 and req.remaining_tokens > 0)
        if sample[-1]:
            sample_rows.append(len(input_ids) - 1)
    reqs = [r for r, _ in picked]
    # Logits rows: one per sampling request first, then the prompt-logprob rows; None when
    # that is the last token of every request (the model's default).
    logit_rows = None if len(sample_rows) == len(reqs) and not lp_rows else np.array(sample_rows + lp_rows)
    step = StepInput(
        rows=np.fromiter((r.row for r in reqs), np.int64, len(reqs)),
        prefix_lens=np.array(prefix_lens, dtype=np.int64),
        extend_lens=np.array(extend_lens, dtype=np.int64),
        input_ids=np.array(input_ids, dtype=np.int64),
        out_slots=np.concatenate(out).astype(np.int64),
        kv_indices=np.concatenate(ctx),
        sampling=srows.inputs([r for r, s in zip(reqs, sample) if s]),
        logit_rows=logit_rows,
        prompt_lp_targets=lp_targets,
        prompt_top_k=max((r.params.top_logprobs for r, c in zip(reqs, lp_counts) if c), default=0),
    )
    advance(picked, sample)
    return Batch(reqs=reqs, step=step, sample=sample, prompt_lp_counts=lp_counts)


def advance(picked: list[tuple[Request, int]], sample: list[bool]) -> None:
    """The batch is built: its tokens now count as computed (or in flight)."""
    for (req, n), s in zip(picked, sample):
        req.kv_len += n
        req.pending += int(s)
