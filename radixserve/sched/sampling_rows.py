"""Host state per table row: the sampler's flags, who is new to a row, and stop ids.

When a request takes a row (`bind`, at admission) its `param_flags` go into
`flags[row]` and the row is marked fresh; the first step that samples for it
carries its parameters (and, with penalties, the ids it has seen) in
`SamplingInputs.init`, which the sampler writes into its device tensors. A
step's inputs are then a few numpy gathers over its rows: the OR of their
flags picks the sampler's paths, and only the requests whose flags are rare
(logit bias, min_tokens) are looked at one by one. A row reused by
another request is fresh again, so it never inherits the previous owner's state.

For output processing (sched/process.py) a row also records whether its
request is quiet (no stop strings, grammar or logprobs), whether an output of
its stream is still unread by its consumer (`unread`: process() sets it, the
event loop's `Stream` clears it when the consumer takes the output),
and its stop ids (EOS unless ignored, and `stop_token_ids`), so a decode
step checks every row's token against them in one array comparison.
"""

from __future__ import annotations

import numpy as np

from radixserve.runtime.sampler import LOGPROBS, PENALTIES, RARE, SamplingInputs, param_flags
from radixserve.sched.request import Request

MAX_STOP_IDS = 4  # stop ids a quiet row can have (more: the request takes the full path)
NO_ID = -2  # padding of `stop_ids` (no token, and not INVALID_TOKEN either)


class SamplingRows:
    def __init__(self, max_rows: int) -> None:
        self.flags = np.zeros(max_rows, dtype=np.int32)
        self.quiet = np.zeros(max_rows, dtype=bool)
        self.unread = np.zeros(max_rows, dtype=bool)  # written by the worker and the event loop
        self.stop_ids = np.full((max_rows, MAX_STOP_IDS), NO_ID, dtype=np.int64)
        self.top_logprobs = np.zeros(max_rows, dtype=np.int32)
        self.fresh = np.zeros(max_rows, dtype=bool)  # bound, parameters not yet on the device

    def bind(self, req: Request) -> None:
        """`req` has just taken `req.row` (admission, first or after a retraction)."""
        p = req.params
        self.flags[req.row] = param_flags(p)
        self.top_logprobs[req.row] = p.top_logprobs if p.logprobs else 0
        self.fresh[req.row] = True
        stop = sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else req.eos_ids))
        self.unread[req.row] = False
        # Streamed requests are quiet too: process() makes their outputs over arrays.
        quiet = not (p.stop or p.logprobs or req.grammar is not None)
        self.quiet[req.row] = quiet and len(stop) <= MAX_STOP_IDS
        self.stop_ids[req.row] = NO_ID
        self.stop_ids[req.row, : min(len(stop), MAX_STOP_IDS)] = stop[:MAX_STOP_IDS]

    def inputs(self, reqs: list[Request], rows: np.ndarray | None = None) -> SamplingInputs:
        """The sampling inputs of `reqs`, which sample this step (`rows`: their rows, if known)."""
        if rows is None:
            rows = np.fromiter((r.row for r in reqs), np.int64, len(reqs))
        flags = self.flags[rows]
        union = int(np.bitwise_or.reduce(flags)) if len(flags) else 0
        inp = SamplingInputs(rows=rows, params=[r.params for r in reqs], flags=union)
        fresh = self.fresh[rows]
        if fresh.any():
            for i in np.flatnonzero(fresh).tolist():
                req = reqs[i]
                inp.init.append((req.row, req.params))
                if flags[i] & PENALTIES:
                    inp.penalty_init.append((req.row, req.all_ids))
            self.fresh[rows[fresh]] = False
        if union & LOGPROBS:
            inp.top_logprobs = int(self.top_logprobs[rows].max())
        if union & RARE:
            for i in np.flatnonzero(flags & RARE).tolist():
                req = reqs[i]
                inp.add_rare(i, req.params, int(flags[i]), len(req.output_ids) + req.pending, req.eos_ids)
        return inp
