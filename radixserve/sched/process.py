"""`OutputProcessor`: after a step, its sampled tokens become request state and outputs.

Most requests of a big decode step are *quiet*: no stop strings, grammar or
logprobs, so their step is one appended token and a length check, and an
output only when someone can read it (their text is decoded lazily when an
output reads it, sched/detokenizer.py). For a decode step the stop-id and EOS
checks of every row run over arrays first (the batch carries each row's stop
ids, sched/sampling_rows.py); only the rows that hit one, produced an invalid
id, or are not quiet take the full per-token path (`on_token`:
detokenization, stop strings, grammar and jump-forward, outputs).

Backpressure: a streamed request gets no new output while its previous one is
still unread by its consumer (`SamplingRows.unread`, set here, cleared by the
event loop's `Stream` when the consumer takes it); the next output carries
every token since (`Request.sent_tokens`). A consumer that keeps up gets every
token in its own output, as soon as its step is processed; one that falls
behind gets fewer, larger outputs, and the worker builds no output for it in
between. Final outputs always go.
"""

from __future__ import annotations

import time

import numpy as np

from radixserve.model.tokenizer import TokenizerLike
from radixserve.outputs import RequestOutput, TokenLogprob
from radixserve.runtime.runner import StepResult
from radixserve.sched import grammar
from radixserve.sched.batch import Batch
from radixserve.sched.config import SchedulerConfig
from radixserve.sched.detokenizer import Detokenizer
from radixserve.sched.output import make_output, stop_rule, stream_due, streamed_output
from radixserve.sched.request import Request, Status
from radixserve.sched.running import RunningSet


class OutputProcessor:
    """Owns what output processing changes beyond the requests: the jump-forward counters.
    Requests end through the `RunningSet` (finish, fail)."""

    def __init__(self, cfg: SchedulerConfig, running: RunningSet, tokenizer: TokenizerLike | None) -> None:
        self.cfg = cfg
        self.running = running
        self.unread = running.sampling_rows.unread  # a streamed row's previous output is unread
        self.tokenizer = tokenizer
        self.jump_forward_tokens = 0  # output tokens appended by jump-forward
        self.jump_discarded = 0  # in-flight tokens dropped for a jump

    def attach(self, req: Request) -> None:
        """A new request: its streaming settings, detokenizer, and the tokens its grammar forces
        before the first one is sampled."""
        p = req.params
        req.stream_every = self.cfg.stream_interval
        req.stream_gap = self.cfg.stream_gap_s
        req.detok = Detokenizer(
            self.tokenizer,
            p.stop,
            p.include_stop_str_in_output,
            p.skip_special_tokens,
            # Text is decoded when an output reads it (same text); stop strings decode per token.
            lazy=True,
            ids=req.output_ids,  # lazy: reads the outputs as they are appended
        )
        if req.grammar is not None and not req.output_ids and not (p.stop or p.stop_token_ids):
            self.jump_forward_tokens += grammar.jump_at_start(req, self.tokenizer)

    def process(self, batch: Batch, result: StepResult) -> list[RequestOutput]:
        outputs = self.running.take_aborted()
        if batch.quiet is not None and result.logprobs is None:
            self._process_decode(batch, result, outputs)
        else:
            self._process_any(batch, result, outputs)
        outputs.extend(self.running.take_aborted())
        return outputs

    def _process_decode(self, batch: Batch, result: StepResult, outputs: list[RequestOutput]) -> None:
        """A decode step: one sampled token per request, the quiet ones without per-token work."""
        assert batch.quiet is not None and batch.stop_ids is not None
        toks = np.asarray(result.next_ids, dtype=np.int64)
        loud = ~batch.quiet | (batch.stop_ids == toks[:, None]).any(axis=1) | (toks < 0)
        unread = self.unread
        now = time.monotonic()  # for the streams' output gaps (EngineConfig.stream_interval_ms)
        held = unread[batch.step.rows]  # a finished request's row may have a new owner: it is skipped below
        finished = Status.FINISHED
        sent: list[int] = []  # rows that got a streamed output
        for req, tok, is_loud, is_held in zip(batch.reqs, result.next_ids, loud.tolist(), held.tolist()):
            if is_loud:
                out = self._sampled(req, tok, None, is_held)
                if out is not None:
                    outputs.append(out)
                    if not out.finished:
                        sent.append(req.row)
                continue
            if req.status is finished:
                continue  # aborted while this step was in flight
            req.pending -= 1
            ids = req.output_ids
            ids.append(tok)  # a quiet request's lazy detokenizer reads this very list
            n = len(ids)
            if n >= req.params.max_tokens or len(req.prompt_ids) + n + req.pending >= req.max_context:
                self.running.finish(req, "length")
                try:  # its lazy detokenization runs now
                    outputs.append(make_output(req, None, final=True))
                except Exception as e:  # noqa: BLE001 - one request's data fails it alone
                    self.running.fail(req, e)
            elif (
                req.stream
                and not is_held
                # stream_due(req, now), inlined: this runs for every streamed row of every step
                and (
                    not req.sent_tokens
                    or (n - req.sent_tokens >= req.stream_every and now >= req.next_output_at)
                )
            ):
                try:
                    outputs.append(streamed_output(req, None, now))
                    sent.append(req.row)
                except Exception as e:  # noqa: BLE001
                    self.running.fail(req, e)
        if sent:
            unread[sent] = True

    def _process_any(self, batch: Batch, result: StepResult, outputs: list[RequestOutput]) -> None:
        j = 0
        lp_j = 0
        unread = self.unread
        step = batch.step
        for i, req in enumerate(batch.reqs):
            n_lp = batch.prompt_lp_counts[i] if batch.prompt_lp_counts else 0
            if n_lp and result.prompt_lps is not None:
                for k in range(lp_j, lp_j + n_lp):
                    lp_val, top = result.prompt_lps[k]
                    top_n = tuple(top[: req.params.top_logprobs])
                    req.prompt_logprobs.append(TokenLogprob(step.prompt_lp_targets[k], lp_val, top_n))
            lp_j += n_lp
            if not batch.sample[i]:
                # A prompt-only request (max_tokens=0) ends with the step of its last part, not
                # with `prefill_done`: in overlap mode its next chunk is built (kv_len advanced)
                # before this one is processed, and that chunk's logprobs are still to come.
                ends = int(step.prefix_lens[i] + step.extend_lens[i]) >= req.num_known - 1
                if not req.finished and ends and req.params.max_tokens == 0:
                    self.running.finish(req, "length")
                    outputs.append(make_output(req, None, final=True))
                continue
            tok = result.next_ids[j]
            lp = None
            if result.logprobs is not None and req.params.logprobs:
                top_j = tuple(result.top[j][: req.params.top_logprobs]) if result.top else ()
                lp = TokenLogprob(tok, result.logprobs[j], top_j)
            j += 1
            out = self._sampled(req, tok, lp, bool(unread[req.row]))
            if out is not None:
                outputs.append(out)
                if not out.finished:
                    unread[req.row] = True

    def _sampled(self, req: Request, tok: int, lp: TokenLogprob | None, held: bool) -> RequestOutput | None:
        """Request `req` sampled `tok` (the full path); `held`: its previous output is still unread."""
        if req.finished:
            return None  # aborted or stopped while this step was in flight
        if req.discard:  # sampled before a jump-forward replaced it (sched/grammar.py)
            req.discard -= 1
            return None
        req.pending -= 1
        if tok < 0:  # INVALID_TOKEN: this row's logits were NaN/inf
            self.running.finish(req, "abort", error="the model produced non-finite logits (NaN/inf)")
            return None
        req.output_ids.append(tok)
        try:
            return self._on_token(req, tok, lp, held)
        except Exception as e:  # noqa: BLE001 - one request's data (its detokenization) fails it alone
            self.running.fail(req, e)
            return None

    def _on_token(
        self, req: Request, tok: int, lp: TokenLogprob | None, held: bool = False
    ) -> RequestOutput | None:
        if req.detok is not None:
            req.detok.add([tok])
        reason, stop_reason = stop_rule(req, tok)
        if reason is None and req.grammar is not None:
            reason, stop_reason = self._grammar_step(req, tok)
        if reason == "abort":
            return None  # its output is in the scheduler's aborted list
        if reason is not None:
            self.running.finish(req, reason, stop_reason)
            return make_output(req, lp, final=True)
        if not req.stream:  # complete(): nobody reads the steps in between
            if lp is not None:
                req.logprobs.append(lp)
            return None
        now = time.monotonic()
        if held or not stream_due(req, now):
            if lp is not None:  # held: the next output carries it (the first one goes at once)
                req.logprobs.append(lp)
            return None
        return streamed_output(req, lp, now)

    def _grammar_step(self, req: Request, tok: int) -> tuple[str | None, str | int | None]:
        """Accept `tok`, then append what the grammar forces (jump-forward), with stop rules."""
        reason, stop_reason, error = grammar.accept(req, tok)
        if reason == "abort":
            self.running.finish(req, "abort", error=error)
        if reason is not None:
            return reason, stop_reason
        discarded = req.jump_discarded
        forced = grammar.jump_forward(req, self.tokenizer, self.cfg.jump_forward_default)
        self.jump_discarded += req.jump_discarded - discarded
        if forced:
            req.jumped = True
        for f in forced:
            req.output_ids.append(f)
            self.jump_forward_tokens += 1
            if req.detok is not None:
                req.detok.add([f])
            reason, stop_reason = stop_rule(req, f)
            if reason is not None:
                return reason, stop_reason
        return None, None
