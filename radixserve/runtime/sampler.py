"""Batched sampling on the device.

One call turns the logits of the requests that sample this step into next
token ids, without a host sync: greedy rows take the argmax; others apply
temperature, top-k, top-p and min-p, then draw with the exponential race
(argmax of p / Exp(1) noise), which is a draw from p. A request with a seed
draws its noise from its own generator seeded by (seed, output index), so its
tokens do not depend on what else is in the batch.

Penalties keep per-row counts on the device ([rows, vocab]), allocated the
first time a request asks for one and updated after every draw. The optional
vocabulary bitmask (structured output) is applied with xgrammar's kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixserve.runtime.host import to_device
from radixserve.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
INVALID_TOKEN = -1  # next id of a row whose logits were NaN/inf


@dataclass
class SamplingInputs:
    rows: list[int]  # each sampling request's row in the runner's buffers
    params: list[SamplingParams]
    num_outputs: list[int]  # index of the token being sampled, per request
    suppress: list[tuple[int, ...]]  # ids masked out (EOS/stop ids before min_tokens)
    # (row, token ids seen so far) for penalized requests whose row state must be (re)built
    penalty_init: list[tuple[int, list[int]]] = field(default_factory=list)
    bitmask: torch.Tensor | None = None  # [n, ceil(vocab/32)] int32, xgrammar layout (host)
    bitmask_rows: list[int] | None = None  # rows the bitmask applies to (None: all)

    @staticmethod
    def from_requests(
        rows: list[int],
        params: list[SamplingParams],
        num_outputs: list[int],
        eos_ids: Sequence[frozenset[int]],
        penalty_init: list[tuple[int, list[int]]] | None = None,
    ) -> SamplingInputs:
        suppress = []
        for p, n, eos in zip(params, num_outputs, eos_ids):
            if n < p.min_tokens:
                suppress.append(tuple(sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else eos))))
            else:
                suppress.append(())
        return SamplingInputs(rows, params, num_outputs, suppress, penalty_init or [])

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def all_greedy(self) -> bool:
        return all(p.greedy for p in self.params)

    @property
    def want_logprobs(self) -> bool:
        return any(p.logprobs for p in self.params)


@dataclass
class SampleOutput:
    next_ids: torch.Tensor  # [n] int64, on the device
    logprobs: torch.Tensor | None = None  # [n] float32: logprob of the chosen token
    top_ids: torch.Tensor | None = None  # [n, k]
    top_logprobs: torch.Tensor | None = None  # [n, k]


class Sampler:
    def __init__(self, vocab_size: int, max_rows: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.device = device
        self._counts: torch.Tensor | None = None  # [max_rows, vocab] output token counts
        self._seen: torch.Tensor | None = None  # [max_rows, vocab] prompt or output token seen
        self._gen = torch.Generator(device=device)
        self._gen.manual_seed(0)

    def __call__(self, logits: torch.Tensor, inp: SamplingInputs) -> SampleOutput:
        """logits `[n, vocab]` float32, one row per sampling request, in `inp` order."""
        logits = logits[:, : self.vocab_size].float()
        raw = logits
        penalized = [i for i, p in enumerate(inp.params) if p.uses_penalties]
        if inp.penalty_init or penalized:
            self._ensure_penalty_state()
        for row, seen_ids in inp.penalty_init:
            self._counts[row].zero_()  # type: ignore[index]
            self._seen[row].zero_()  # type: ignore[index]
            if seen_ids:
                self._seen[row, to_device(seen_ids, torch.int64, self.device)] = True  # type: ignore[index]
        if penalized or any(inp.suppress) or any(p.logit_bias for p in inp.params) or inp.bitmask is not None:
            logits = logits.clone()
        if penalized:
            self._apply_penalties(logits, inp, penalized)
        for i, p in enumerate(inp.params):
            if p.logit_bias:
                ids = to_device(list(p.logit_bias), torch.int64, self.device)
                logits[i, ids] += to_device(list(p.logit_bias.values()), torch.float32, self.device)
            if inp.suppress[i]:
                logits[i, to_device(inp.suppress[i], torch.int64, self.device)] = float("-inf")
        if inp.bitmask is not None:
            import xgrammar

            mask = inp.bitmask
            mask_rows: Any = inp.bitmask_rows
            if logits.device.type == "cuda":
                # Both copies queued like kernels (see host.py): a list of indices would make
                # xgrammar copy from pageable memory, a hidden sync on the forward pass.
                mask = mask.pin_memory().to(logits.device, non_blocking=True)
                if mask_rows is not None:
                    mask_rows = to_device(mask_rows, torch.int32, self.device)
            xgrammar.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size, indices=mask_rows)

        next_ids = logits.argmax(dim=-1) if inp.all_greedy else self._sample(logits, inp)

        rows = to_device(inp.rows, torch.int64, self.device)
        if self._counts is not None and penalized:
            self._counts[rows, next_ids] += 1
            self._seen[rows, next_ids] = True  # type: ignore[index]

        out = SampleOutput(next_ids=next_ids)
        if inp.want_logprobs:
            lp = torch.log_softmax(raw, dim=-1)
            out.logprobs = lp.gather(1, next_ids[:, None])[:, 0]
            k = max(p.top_logprobs for p in inp.params)
            if k:
                out.top_logprobs, out.top_ids = lp.topk(k, dim=-1)
        # A row whose model logits are not finite gets id -1 (no extra sync: it rides on
        # the step's one copy); the scheduler aborts that request alone.
        out.next_ids = torch.where(torch.isfinite(raw).all(dim=-1), next_ids, INVALID_TOKEN)
        return out

    def _sample(self, logits: torch.Tensor, inp: SamplingInputs) -> torch.Tensor:
        n = len(inp)
        temps = to_device(
            [1.0 if p.greedy else p.temperature for p in inp.params], torch.float32, self.device
        )
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        top_k = [p.top_k for p in inp.params]
        top_p = [p.top_p for p in inp.params]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            probs = _top_k_top_p(probs, top_k, top_p, self.device)
        min_p = [p.min_p for p in inp.params]
        if any(m > 0 for m in min_p):
            mp = to_device(min_p, torch.float32, self.device)[:, None]
            probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        noise = torch.empty_like(probs)
        for i, p in enumerate(inp.params):
            if p.seed is not None:
                g = torch.Generator(device=self.device)
                g.manual_seed(((p.seed * _SEED_MIX) ^ inp.num_outputs[i]) & 0x7FFFFFFFFFFFFFFF)
                noise[i].exponential_(generator=g)
            else:
                noise[i].exponential_(generator=self._gen)
        sampled = (probs / noise).argmax(dim=-1)
        greedy = to_device([p.greedy for p in inp.params], torch.bool, self.device)
        return torch.where(greedy, logits.argmax(dim=-1), sampled) if n else sampled

    def _ensure_penalty_state(self) -> None:
        if self._counts is None:
            shape = (self.max_rows, self.vocab_size)
            self._counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self._seen = torch.zeros(shape, dtype=torch.bool, device=self.device)

    def _apply_penalties(self, logits: torch.Tensor, inp: SamplingInputs, idx: list[int]) -> None:
        assert self._counts is not None and self._seen is not None
        sel = to_device(idx, torch.int64, self.device)
        rows = to_device([inp.rows[i] for i in idx], torch.int64, self.device)
        counts = self._counts[rows].float()
        seen = self._seen[rows]
        rep = to_device([inp.params[i].repetition_penalty for i in idx], torch.float32, self.device)[:, None]
        freq = to_device([inp.params[i].frequency_penalty for i in idx], torch.float32, self.device)[:, None]
        pres = to_device([inp.params[i].presence_penalty for i in idx], torch.float32, self.device)[:, None]
        sub = logits[sel]
        # Repetition penalty as in transformers: divide positive, multiply negative logits.
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        sub = sub - freq * counts - pres * (counts > 0).float()
        logits[sel] = sub


def _top_k_top_p(
    probs: torch.Tensor, top_k: list[int], top_p: list[float], device: torch.device
) -> torch.Tensor:
    sorted_p, order = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[-1]
    # Any top_k >= 1 is valid; beyond the vocabulary it means the whole vocabulary.
    k = to_device([t if 0 < t < vocab else vocab for t in top_k], torch.int64, device)[:, None]
    ranks = torch.arange(vocab, device=device)[None, :]
    drop = ranks >= k
    cum = sorted_p.cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop |= (cum - sorted_p) >= to_device(top_p, torch.float32, device)[:, None]
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)
