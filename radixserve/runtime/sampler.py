"""Batched sampling on the device.

One call turns the logits of the requests that sample this step into next
token ids, without a host sync: greedy rows take the argmax (an all-greedy
step without logit edits is one max over the logits in their own dtype); others apply
temperature, top-k, top-p and min-p, then draw with the exponential race
(argmax of p / Exp(1) noise), which is a draw from p (runtime/sample_ops.py).

The noise is counter-based (runtime/noise.py): a hash of the row's key and the
position of the token whose logits are sampled. A request with a seed has the
key of its seed, others a random key drawn when they take their row, so a
seeded request's tokens depend on its seed and its sequence alone, not on the
rest of the batch nor on whether a CUDA graph (runtime/sampled_graphs.py)
or this eager path drew them. Every step that samples needs those positions
on the device (`positions`); the runner has them from the forward batch.

Per-row state lives on the device, indexed by the request's row: its numeric
parameters (`params`, [max_rows + 1, 8]) and its noise key (`keys`) are written
once when a request takes its row (`SamplingInputs.init`), and a step gathers
them by its rows tensor instead of rebuilding them from Python lists. Which
paths a step needs (all greedy, top-k/p, min-p, penalties, logprobs) comes
from `flags`, the OR of its rows' `param_flags`, kept on the host by the
scheduler (sched/sampling_rows.py); only the rare rows with a logit bias or a
min_tokens suppression are handled one by one, here and never in a graph.
The row past the last (`max_rows`) is scratch: the padding rows of a graph
read and write it.

Penalties keep per-row counts on the device ([rows, vocab]), allocated the
first time a request asks for one (or when sampled graphs are captured) and
updated after every draw of a step that penalizes; a step that penalizes
applies them to all its rows, which is exact for the rows whose penalties are
neutral. The optional vocabulary bitmask (structured output) is applied with
xgrammar's kernel. A row whose model logits have a NaN, a +inf or no finite
entry (its max is not finite) gets INVALID_TOKEN, and the scheduler aborts
that request alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from radixserve.host_copy import to_device
from radixserve.runtime.logit_edits import apply_host_edits
from radixserve.runtime.noise import column_keys, row_key
from radixserve.runtime.sample_ops import apply_penalties, draw
from radixserve.sampling_params import SamplingParams

# Logits sampled at once (rows x vocabulary). The temporaries (a stable sort with int64
# indices, cumulative sums, int64 noise) take tens of bytes per entry: a full batch of a 262k
# vocabulary (Gemma 3) in one go would need GiBs.
CHUNK_ENTRIES = 1 << 24

INVALID_TOKEN = -1  # next id of a row whose logits' max was NaN or +-inf (`_mark_invalid`)

# What a row's parameters ask of the sampler; a step ORs them over its rows.
SAMPLED, TOP_K_P, MIN_P, PENALTIES, LOGPROBS, BIAS, MIN_TOKENS = (1 << i for i in range(7))
RARE = BIAS | MIN_TOKENS  # handled per request, for the requests that have them


def param_flags(p: SamplingParams) -> int:
    f = 0 if p.greedy else SAMPLED
    if not p.greedy:
        f |= (TOP_K_P if p.top_k > 0 or p.top_p < 1.0 else 0) | (MIN_P if p.min_p > 0 else 0)
    f |= PENALTIES if p.uses_penalties else 0
    f |= LOGPROBS if p.logprobs else 0
    f |= BIAS if p.logit_bias else 0
    f |= MIN_TOKENS if p.min_tokens > 0 else 0
    return f


def suppressed_ids(p: SamplingParams, eos_ids: frozenset[int]) -> tuple[int, ...]:
    """Ids masked before min_tokens: the stop ids, and EOS unless ignored."""
    return tuple(sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else eos_ids)))


@dataclass
class SamplingInputs:
    rows: np.ndarray  # [n] int64: each sampling request's row in the runner's buffers
    params: list[SamplingParams]  # per request (rare rows, test hooks)
    flags: int  # OR of the requests' param_flags
    # Requests taking their row this step: their parameters are written into the row first.
    init: list[tuple[int, SamplingParams]] = field(default_factory=list)
    # (row, token ids seen so far) for penalized requests whose row state must be (re)built
    penalty_init: list[tuple[int, list[int]]] = field(default_factory=list)
    suppress: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (index, ids masked)
    bias: list[int] = field(default_factory=list)  # indices with a logit_bias
    top_logprobs: int = 0  # most alternatives any request wants
    bitmask: torch.Tensor | None = None  # [n, ceil(vocab/32)] int32, xgrammar layout (host)
    bitmask_rows: list[int] | None = None  # rows the bitmask applies to (None: all)

    @staticmethod
    def from_requests(
        rows: Sequence[int],
        params: list[SamplingParams],
        num_outputs: Sequence[int],
        eos_ids: Sequence[frozenset[int]],
        penalty_init: list[tuple[int, list[int]]] | None = None,
    ) -> SamplingInputs:
        """Inputs that (re)write every row's parameters: for callers without a scheduler."""
        flags = [param_flags(p) for p in params]
        inp = SamplingInputs(
            rows=np.asarray(rows, dtype=np.int64),
            params=list(params),
            flags=int(np.bitwise_or.reduce(flags)) if flags else 0,
            init=list(zip(rows, params)),
            penalty_init=penalty_init or [],
            top_logprobs=max((p.top_logprobs for p in params if p.logprobs), default=0),
        )
        for i, (p, f) in enumerate(zip(params, flags)):
            inp.add_rare(i, p, f, num_outputs[i], eos_ids[i])
        return inp

    def add_rare(self, i: int, p: SamplingParams, flags: int, num_output: int, eos: frozenset[int]) -> None:
        """Record request i's per-request work (`num_output`: index of the token it samples)."""
        if flags & MIN_TOKENS and num_output < p.min_tokens:
            self.suppress.append((i, suppressed_ids(p, eos)))
        if flags & BIAS:
            self.bias.append(i)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def all_greedy(self) -> bool:
        return not self.flags & SAMPLED

    @property
    def want_logprobs(self) -> bool:
        return bool(self.flags & LOGPROBS)

    @property
    def host_edits(self) -> bool:
        """Logit edits listed on the host (bias, min_tokens suppression, a grammar's bitmask)."""
        return bool(self.suppress or self.bias or self.bitmask is not None)

    @property
    def argmax_only(self) -> bool:
        """Every row greedy, with no logit edits (penalties, suppression, bias, bitmask) and no
        logprobs: the step's ids are the argmax of its logits (`greedy_argmax`)."""
        edits = self.flags & PENALTIES or self.host_edits
        return self.all_greedy and not edits and not self.want_logprobs

    @property
    def device_only(self) -> bool:
        """Everything the step asks is per-row device state: no host edits, no logprobs
        (what a sampled graph replays: runtime/sampled_graphs.py)."""
        return not self.host_edits and not self.want_logprobs


@dataclass
class SampleOutput:
    next_ids: torch.Tensor  # [n] int64, on the device
    logprobs: torch.Tensor | None = None  # [n] float32: logprob of the chosen token
    top_ids: torch.Tensor | None = None  # [n, k]
    top_logprobs: torch.Tensor | None = None  # [n, k]
    rows: torch.Tensor | None = None  # [n] int64 on the device: the requests' rows


class Sampler:
    def __init__(self, vocab_size: int, max_rows: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.device = device
        # Per-row parameters (sample_ops' columns) and noise keys, written when a request takes
        # its row; row `max_rows` is the graphs' scratch (greedy, neutral: no NaN from padding).
        self.params = torch.zeros(max_rows + 1, 8, dtype=torch.float32, device=device)
        self.params[max_rows] = torch.tensor(self._row_values(SamplingParams(temperature=0)))
        self.keys = torch.zeros(max_rows + 1, dtype=torch.int64, device=device)
        self.columns = column_keys(vocab_size, device)
        self.counts: torch.Tensor | None = None  # [max_rows + 1, vocab] output token counts
        self.seen: torch.Tensor | None = None  # [max_rows + 1, vocab] prompt or output token seen
        self._unseeded = np.random.default_rng(0)  # keys of requests without a seed
        # The value `count` writes into `seen`: a device scalar, since a Python `True` is a host
        # tensor, which CUDA-graph capture refuses to copy.
        self._true = torch.ones((), dtype=torch.bool, device=device)
        self.calls = 0  # eager calls (tests: how many steps a graph did not sample)
        # Rows sampled at once: at most CHUNK_ENTRIES logits (runtime/workspace.py).
        self.chunk_rows = max(1, CHUNK_ENTRIES // vocab_size)

    def _row_values(self, p: SamplingParams) -> list[float]:
        k = p.top_k if 0 < p.top_k < self.vocab_size else self.vocab_size
        temp = 1.0 if p.greedy else p.temperature
        pen = (p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        return [temp, float(k), p.top_p, p.min_p, float(p.greedy), *pen]

    def prepare(self, inp: SamplingInputs) -> None:
        """Queue the writes of the rows `inp` (re)binds: parameters, keys, penalty state."""
        if inp.init:
            self._write_rows(inp.init)
        if inp.penalty_init or inp.flags & PENALTIES:
            self.ensure_penalty_state()
        for row, seen_ids in inp.penalty_init:
            self.counts[row].zero_()  # type: ignore[index]
            self.seen[row].zero_()  # type: ignore[index]
            if seen_ids:
                self.seen[row, to_device(seen_ids, torch.int64, self.device)] = True  # type: ignore[index]

    def _write_rows(self, init: list[tuple[int, SamplingParams]]) -> None:
        # One copy: the row index rides in the first column (exact in float32 below 2**24).
        packed = np.array([[row, *self._row_values(p)] for row, p in init], dtype=np.float32)
        t = to_device(packed, torch.float32, self.device)
        self.params[t[:, 0].long()] = t[:, 1:]
        keys = np.array(
            [
                [row, row_key(p.seed) if p.seed is not None else int(self._unseeded.integers(1 << 62))]
                for row, p in init
            ],
            dtype=np.int64,
        )
        k = to_device(keys, torch.int64, self.device)
        self.keys[k[:, 0]] = k[:, 1]

    def ensure_penalty_state(self) -> None:
        if self.counts is None:
            shape = (self.max_rows + 1, self.vocab_size)
            self.counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self.seen = torch.zeros(shape, dtype=torch.bool, device=self.device)

    def __call__(
        self,
        logits: torch.Tensor,
        inp: SamplingInputs,
        rows: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> SampleOutput:
        """logits `[n, >= vocab]` (any float dtype), one row per sampling request, in `inp` order;
        `rows`: `inp.rows` already on the device (a decode step has them), else copied;
        `positions` [n] int64 on the device: where each row's sampled logits were computed
        (the position of its last input token), which keys its noise; needed when any row samples."""
        self.calls += 1
        if rows is None:
            rows = to_device(inp.rows, torch.int64, self.device)
        self.prepare(inp)
        if inp.argmax_only:
            return SampleOutput(next_ids=greedy_argmax(logits, self.vocab_size), rows=rows)
        if not inp.all_greedy and positions is None:
            raise ValueError("a step with sampled rows needs their positions (they key the noise)")
        penalties = bool(inp.flags & PENALTIES)
        logits = logits[:, : self.vocab_size].float()
        raw = logits
        if penalties or inp.host_edits:
            logits = logits.clone()
        if penalties:
            self.penalize(logits, rows)
        if inp.host_edits:
            bias = [(i, inp.params[i].logit_bias) for i in inp.bias]
            apply_host_edits(logits, bias, inp.suppress, inp.bitmask, inp.bitmask_rows, self.vocab_size)
        if inp.all_greedy:
            next_ids = logits.argmax(dim=-1)
        else:
            assert positions is not None
            top_k_p, min_p = bool(inp.flags & TOP_K_P), bool(inp.flags & MIN_P)
            next_ids = self.draw(logits, rows, positions, top_k_p, min_p)
        if penalties:
            self.count(rows, next_ids)

        out = SampleOutput(next_ids=next_ids, rows=rows)
        if inp.want_logprobs:
            lp = torch.log_softmax(raw, dim=-1)
            out.logprobs = lp.gather(1, next_ids[:, None])[:, 0]
            if inp.top_logprobs:
                out.top_logprobs, out.top_ids = lp.topk(inp.top_logprobs, dim=-1)
        out.next_ids = _mark_invalid(next_ids, raw.max(dim=-1).values)
        return out

    # The device half, shared with the sampled graphs: no host reads, fixed shapes.

    # Both work through the rows in chunks of `chunk_rows`: every op is per row, so the tokens
    # are the same, and the temporaries (a sort, cumulative sums, int64 noise) are a chunk's.

    def _chunks(self, n: int) -> list[slice]:
        """Slices of `n` rows (one, empty, for none)."""
        return [slice(i, min(i + self.chunk_rows, n)) for i in range(0, max(n, 1), self.chunk_rows)]

    def penalize(self, logits: torch.Tensor, rows: torch.Tensor) -> None:
        """Apply each row's penalties to `logits` [n, vocab] float32 in place."""
        assert self.counts is not None and self.seen is not None, "ensure_penalty_state first"
        for c in self._chunks(logits.shape[0]):
            r = rows[c]
            apply_penalties(logits[c], self.counts[r], self.seen[r], self.params[r])

    def draw(
        self, logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, top_k_p: bool, min_p: bool
    ) -> torch.Tensor:
        """Next ids of `logits` [n, vocab] float32 (edits applied) by each row's parameters."""
        out = []
        for c in self._chunks(logits.shape[0]):
            r = rows[c]  # the chunk's parameters and keys: one gather each
            out.append(
                draw(logits[c], self.params[r], self.keys[r], positions[c], self.columns, top_k_p, min_p)
            )
        return out[0] if len(out) == 1 else torch.cat(out)

    def count(self, rows: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Record each row's drawn token in its penalty state. A plain indexed add: the step's
        rows are distinct, but for the graphs' padding, which all land on the scratch row."""
        assert self.counts is not None and self.seen is not None
        self.counts[rows, next_ids] += 1
        self.seen.index_put_((rows, next_ids), self._true)

    def sample_device(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
        top_k_p: bool,
        penalties: bool,
    ) -> torch.Tensor:
        """What a sampled graph captures: `__call__` for a step of `device_only` inputs whose
        rows' parameters are already written, with min-p always applied (neutral where 0)."""
        x = logits[:, : self.vocab_size].float()
        row_max = x.max(dim=-1).values
        if penalties:
            x = x.clone()
            self.penalize(x, rows)
        next_ids = self.draw(x, rows, positions, top_k_p, min_p=True)
        if penalties:
            self.count(rows, next_ids)
        return _mark_invalid(next_ids, row_max)


def greedy_argmax(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The argmax of each row's first `vocab_size` logits (INVALID_TOKEN for broken rows): one
    reduction in the logits' own dtype (bf16 -> f32 is exact, so the argmax is the same;
    max(dim) returns the first of tied maxima). Graph-capturable (runtime/greedy_graphs.py)."""
    values, next_ids = logits[:, :vocab_size].max(dim=-1)
    return _mark_invalid(next_ids, values)


def _mark_invalid(next_ids: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """INVALID_TOKEN where a row's model logits are broken: its max is NaN (NaN propagates
    through max), +inf, or -inf (every entry -inf). A -inf entry in an otherwise finite row is
    probability 0, not a fault. No extra sync: the ids ride on the step's one copy, and the
    scheduler aborts that request alone."""
    return torch.where(torch.isfinite(row_max), next_ids, INVALID_TOKEN)
