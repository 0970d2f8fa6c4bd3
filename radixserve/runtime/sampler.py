"""Batched sampling on the device.

One call turns the logits of the requests that sample this step into next
token ids, without a host sync: greedy rows take the argmax (an all-greedy
step without logit edits is one max over the logits in their own dtype); others apply
temperature, top-k, top-p and min-p, then draw with the exponential race
(argmax of p / Exp(1) noise), which is a draw from p. A request with a seed
draws its noise from its own generator seeded by (seed, output index), so its
tokens do not depend on what else is in the batch.

Per-row state lives on the device, indexed by the request's row: its numeric
parameters (`_params`, [max_rows, 8]) are written once when a request takes
its row (`SamplingInputs.init`), and a step gathers them by its rows tensor
instead of rebuilding them from Python lists. Which paths a step needs (all
greedy, top-k/p, min-p, penalties, logprobs) comes from `flags`, the OR of its
rows' `param_flags`, kept on the host by the scheduler (sched/sampling_rows.py);
only the rare rows with a logit bias, a min_tokens suppression or a seed are
handled one by one.

Penalties keep per-row counts on the device ([rows, vocab]), allocated the
first time a request asks for one and updated after every draw. The optional
vocabulary bitmask (structured output) is applied with xgrammar's kernel.
A row whose model logits have a NaN, a +inf or no finite entry (its max is
not finite) gets INVALID_TOKEN, and the scheduler aborts that request alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from radixserve.host_copy import to_device
from radixserve.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
INVALID_TOKEN = -1  # next id of a row whose logits' max was NaN or +-inf (`_mark_invalid`)

# What a row's parameters ask of the sampler; a step ORs them over its rows.
SAMPLED, TOP_K_P, MIN_P, PENALTIES, LOGPROBS, BIAS, SEED, MIN_TOKENS = (1 << i for i in range(8))
RARE = BIAS | SEED | MIN_TOKENS  # handled per request, for the requests that have them


def param_flags(p: SamplingParams) -> int:
    f = 0 if p.greedy else SAMPLED
    if not p.greedy:
        f |= (TOP_K_P if p.top_k > 0 or p.top_p < 1.0 else 0) | (MIN_P if p.min_p > 0 else 0)
        f |= SEED if p.seed is not None else 0
    f |= PENALTIES if p.uses_penalties else 0
    f |= LOGPROBS if p.logprobs else 0
    f |= BIAS if p.logit_bias else 0
    f |= MIN_TOKENS if p.min_tokens > 0 else 0
    return f


def seed_key(seed: int, output_index: int) -> int:
    """The generator seed of a seeded request's draw number `output_index`."""
    return ((seed * _SEED_MIX) ^ output_index) & 0x7FFFFFFFFFFFFFFF


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
    penalized: np.ndarray | None = None  # indices (into this step's requests) with penalties
    seeds: list[tuple[int, int]] = field(default_factory=list)  # (index, seed_key) of seeded rows
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
            penalized=np.flatnonzero([f & PENALTIES for f in flags]),
            top_logprobs=max((p.top_logprobs for p in params if p.logprobs), default=0),
        )
        for i, (p, f) in enumerate(zip(params, flags)):
            inp.add_rare(i, p, f, num_outputs[i], eos_ids[i])
        return inp

    def add_rare(self, i: int, p: SamplingParams, flags: int, num_output: int, eos: frozenset[int]) -> None:
        """Record request i's per-request work (`num_output`: index of the token it samples)."""
        if flags & SEED:
            self.seeds.append((i, seed_key(p.seed, num_output)))  # type: ignore[arg-type]
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
    def argmax_only(self) -> bool:
        """Every row greedy, with no logit edits (penalties, suppression, bias, bitmask) and no
        logprobs: the step's ids are the argmax of its logits (`greedy_argmax`)."""
        edits = self.flags & PENALTIES or self.suppress or self.bias or self.bitmask is not None
        return self.all_greedy and not edits and not self.want_logprobs


@dataclass
class SampleOutput:
    next_ids: torch.Tensor  # [n] int64, on the device
    logprobs: torch.Tensor | None = None  # [n] float32: logprob of the chosen token
    top_ids: torch.Tensor | None = None  # [n, k]
    top_logprobs: torch.Tensor | None = None  # [n, k]
    rows: torch.Tensor | None = None  # [n] int64 on the device: the requests' rows


# Columns of Sampler._params.
_TEMP, _TOP_K, _TOP_P, _MIN_P, _GREEDY, _REP, _FREQ, _PRES = range(8)


class Sampler:
    def __init__(self, vocab_size: int, max_rows: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.device = device
        # Per-row numeric parameters (columns above), written when a request takes its row.
        self._params = torch.zeros(max_rows, 8, dtype=torch.float32, device=device)
        self._counts: torch.Tensor | None = None  # [max_rows, vocab] output token counts
        self._seen: torch.Tensor | None = None  # [max_rows, vocab] prompt or output token seen
        self._gen = torch.Generator(device=device)
        self._gen.manual_seed(0)
        self._seeded = torch.Generator(device=device)

    def _row_values(self, p: SamplingParams) -> list[float]:
        k = p.top_k if 0 < p.top_k < self.vocab_size else self.vocab_size
        temp = 1.0 if p.greedy else p.temperature
        pen = (p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        return [temp, float(k), p.top_p, p.min_p, float(p.greedy), *pen]

    def _write_rows(self, init: list[tuple[int, SamplingParams]]) -> None:
        # One copy: the row index rides in the first column (exact in float32 below 2**24).
        packed = np.array([[row, *self._row_values(p)] for row, p in init], dtype=np.float32)
        t = to_device(packed, torch.float32, self.device)
        self._params[t[:, 0].long()] = t[:, 1:]

    def __call__(
        self, logits: torch.Tensor, inp: SamplingInputs, rows: torch.Tensor | None = None
    ) -> SampleOutput:
        """logits `[n, >= vocab]` (any float dtype), one row per sampling request, in `inp` order;
        `rows`: `inp.rows` already on the device (a decode step has them), else copied."""
        if rows is None:
            rows = to_device(inp.rows, torch.int64, self.device)
        if inp.init:
            self._write_rows(inp.init)
        penalized = inp.penalized if inp.flags & PENALTIES else None
        if inp.penalty_init or penalized is not None:
            self._ensure_penalty_state()
        for row, seen_ids in inp.penalty_init:
            self._counts[row].zero_()  # type: ignore[index]
            self._seen[row].zero_()  # type: ignore[index]
            if seen_ids:
                self._seen[row, to_device(seen_ids, torch.int64, self.device)] = True  # type: ignore[index]
        if inp.argmax_only:
            return SampleOutput(next_ids=greedy_argmax(logits, self.vocab_size), rows=rows)
        edits = bool(penalized is not None or inp.suppress or inp.bias or inp.bitmask is not None)
        logits = logits[:, : self.vocab_size].float()
        raw = logits
        if edits:
            logits = logits.clone()
        pen_sel = pen_rows = None
        if penalized is not None and len(penalized):
            pen_sel = to_device(penalized, torch.int64, self.device)
            pen_rows = rows[pen_sel]
            self._apply_penalties(logits, pen_sel, pen_rows)
        for i in inp.bias:
            b = inp.params[i].logit_bias
            logits[i, to_device(list(b), torch.int64, self.device)] += to_device(
                list(b.values()), torch.float32, self.device
            )
        for i, ids in inp.suppress:
            logits[i, to_device(ids, torch.int64, self.device)] = float("-inf")
        if inp.bitmask is not None:
            import xgrammar

            mask = inp.bitmask
            mask_rows: Any = inp.bitmask_rows  # Any: xgrammar's hint says a list; it takes a tensor too
            if logits.device.type == "cuda":
                # Both copies queued like kernels (see host_copy.py): a list of indices would make
                # xgrammar copy from pageable memory, a hidden sync on the forward pass.
                mask = mask.pin_memory().to(logits.device, non_blocking=True)
                if mask_rows is not None:
                    mask_rows = to_device(mask_rows, torch.int32, self.device)
            xgrammar.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size, indices=mask_rows)

        next_ids = logits.argmax(dim=-1) if inp.all_greedy else self._sample(logits, inp, rows)

        if pen_sel is not None and pen_rows is not None:
            chosen = next_ids[pen_sel]
            self._counts[pen_rows, chosen] += 1  # type: ignore[index]
            self._seen[pen_rows, chosen] = True  # type: ignore[index]

        out = SampleOutput(next_ids=next_ids, rows=rows)
        if inp.want_logprobs:
            lp = torch.log_softmax(raw, dim=-1)
            out.logprobs = lp.gather(1, next_ids[:, None])[:, 0]
            if inp.top_logprobs:
                out.top_logprobs, out.top_ids = lp.topk(inp.top_logprobs, dim=-1)
        out.next_ids = _mark_invalid(next_ids, raw.max(dim=-1).values)
        return out

    def _sample(self, logits: torch.Tensor, inp: SamplingInputs, rows: torch.Tensor) -> torch.Tensor:
        par = self._params[rows]  # [n, 8]: one gather for every parameter of the step
        probs = torch.softmax(logits / par[:, _TEMP : _TEMP + 1], dim=-1)
        if inp.flags & TOP_K_P:
            probs = _top_k_top_p(probs, par[:, _TOP_K : _TOP_K + 1].long(), par[:, _TOP_P : _TOP_P + 1])
        if inp.flags & MIN_P:
            mp = par[:, _MIN_P : _MIN_P + 1]
            probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        noise = torch.empty_like(probs).exponential_(generator=self._gen)
        for i, key in inp.seeds:  # a seeded row's noise depends on its seed and position alone
            # One generator, reseeded per row: a launched kernel has already taken its seed.
            self._seeded.manual_seed(key)
            noise[i].exponential_(generator=self._seeded)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(par[:, _GREEDY] > 0, logits.argmax(dim=-1), sampled)

    def _ensure_penalty_state(self) -> None:
        if self._counts is None:
            shape = (self.max_rows, self.vocab_size)
            self._counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self._seen = torch.zeros(shape, dtype=torch.bool, device=self.device)

    def _apply_penalties(self, logits: torch.Tensor, sel: torch.Tensor, rows: torch.Tensor) -> None:
        assert self._counts is not None and self._seen is not None
        counts = self._counts[rows].float()
        seen = self._seen[rows]
        par = self._params[rows]
        rep, freq, pres = (par[:, c : c + 1] for c in (_REP, _FREQ, _PRES))
        sub = logits[sel]
        # Repetition penalty as in transformers: divide positive, multiply negative logits.
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        sub = sub - freq * counts - pres * (counts > 0).float()
        logits[sel] = sub


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


def _top_k_top_p(probs: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`k` [n, 1] int64 (already clamped to the vocabulary), `top_p` [n, 1] float32."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    drop = ranks >= k
    cum = sorted_p.cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop |= (cum - sorted_p) >= top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)
