"""`Request`: one sequence's state while the scheduler owns it.

A request moves WAITING -> (prefilling, in chunks) -> RUNNING -> FINISHED;
retraction sends a RUNNING request back to WAITING with its output kept, and
abort ends it from any state. Only the worker thread touches a Request.

KV bookkeeping: `slots[:kv_len]` are the KV slots of `all_ids[:kv_len]`
(cached prefix first, then what this request computed). `slots` may hold one
more slot than `kv_len` while a step is in flight. `lock_node` is the radix
node this request holds locked (its cached prefix); `own_from` is where the
slots this request allocated itself begin.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixserve.cache.tree_node import TreeNode
from radixserve.constrained.base import Matcher
from radixserve.outputs import TokenLogprob
from radixserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixserve.sched.detokenizer import Detokenizer


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"  # prefilling (chunks left) or decoding
    FINISHED = "finished"


# eq=False: requests are compared by identity (`req in running`, `running.remove(req)`);
# the generated __eq__ compared every field, lists included, at each finish.
@dataclass(eq=False)
class Request:
    rid: str
    index: int  # which of the caller's n completions
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    max_context: int
    extra_key: str | None = None
    arrival: int = 0  # monotonically increasing submit order (FCFS tie-break)
    stream: bool = True  # False: the caller wants only the final output (complete())
    stream_every: int = 1  # streamed: an output every this many tokens (EngineConfig.stream_interval)
    stream_gap: float = 0.0  # ...and no sooner than this many seconds after the previous one

    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    # KV state
    slots: list[int] = field(default_factory=list)
    kv_len: int = 0
    own_from: int = 0  # slots[own_from:] were allocated by this request
    lock_node: TreeNode | None = None
    cached_tokens: int = 0  # prompt tokens served from the cache (first admission)
    admitted: bool = False
    # in flight: a step has been launched whose sampled token is not yet known
    pending: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    # Sampling state shared with the runner (row in its per-request buffers).
    row: int = -1
    detok: Detokenizer | None = None  # its Detokenizer (text and stop strings), set by the scheduler
    logprobs: list[TokenLogprob] = field(default_factory=list)  # TokenLogprob per output token, when asked
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # Structured output (sched/grammar.py): the matcher, and jump-forward's books.
    grammar: Matcher | None = None  # consistent with output_ids
    jumped: bool = False  # forced tokens appended whose KV is not scheduled yet
    discard: int = 0  # tokens in flight to drop (sampled before a jump replaced them)
    jump_tokens: int = 0  # output tokens appended by jump-forward
    jump_discarded: int = 0  # in-flight tokens dropped because of a jump
    # output_ids[:sent_tokens] and logprobs[:sent_logprobs] are in outputs already: the next
    # output's deltas are the rest (forced tokens before the first one, tokens held by stream_every).
    sent_tokens: int = 0
    sent_logprobs: int = 0
    next_output_at: float = 0.0  # time.monotonic() before which no streamed output goes (not the final)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_known(self) -> int:
        """Tokens whose ids the host knows (prompt + outputs)."""
        return len(self.prompt_ids) + len(self.output_ids)

    def known_ids(self, start: int, end: int) -> list[int]:
        """`all_ids[start:end]` without copying the whole sequence (hot path)."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def num_tokens(self) -> int:
        """Tokens whose ids are known or in flight (prompt + outputs + pending)."""
        return len(self.prompt_ids) + len(self.output_ids) + self.pending

    @property
    def prefill_done(self) -> bool:
        """Whether all tokens but the last known one have KV (decode can go on)."""
        return self.kv_len >= len(self.prompt_ids) + len(self.output_ids) - 1 and self.kv_len > 0

    @property
    def chunking(self) -> bool:
        """A prompt half-way through chunked prefill (not forced tokens of a jump)."""
        return not self.prefill_done and not self.jumped

    def scored_positions(self, start: int, n: int) -> range:
        """The prompt positions whose logprobs a chunk of `n` new tokens from `start` scores:
        input token p - 1 predicts position p, from `prompt_logprobs_start` (at least 1) on,
        less those scored before a retraction."""
        if not self.params.prompt_logprobs:
            return range(0)
        first = max(self.params.prompt_logprobs_start, 1) + len(self.prompt_logprobs)
        return range(max(first, start + 1), min(start + n, len(self.prompt_ids) - 1) + 1)

    def chunk_scoring_at_most(self, start: int, n: int, rows: int) -> int:
        """The longest chunk of at most `n` tokens from `start` that scores at most `rows`
        prompt positions (the positions before its first scored one cost nothing)."""
        scored = self.scored_positions(start, n)
        if len(scored) <= rows:
            return n
        return scored.start - 1 - start + rows  # the chunk's last token predicts scored[rows - 1]

    @property
    def remaining_tokens(self) -> int:
        """How many more tokens this request may still generate."""
        by_max = self.params.max_tokens - len(self.output_ids) - self.pending
        by_ctx = self.max_context - self.num_tokens
        return max(0, min(by_max, by_ctx))

    @property
    def can_decode(self) -> bool:
        """`prefill_done`, only the last token lacks KV, and `remaining_tokens > 0`, in one
        pass (the decode step asks it of every running request)."""
        n_out = len(self.output_ids) + self.pending
        tokens = len(self.prompt_ids) + n_out
        return 0 < self.kv_len == tokens - 1 and self.params.max_tokens > n_out and self.max_context > tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
