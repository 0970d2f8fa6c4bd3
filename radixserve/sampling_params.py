"""`SamplingParams`: how one request samples and when it stops.

Validated on construction, in the caller's thread: a bad value raises
`ValueError` naming the field, so nothing invalid ever reaches the worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve import validation as V
from radixserve.constrained.spec import (
    KINDS,
    GrammarSpec,
    canonical_choice,
    canonical_json_schema,
    canonical_structural_tag,
    check_ebnf,
    check_regex,
    spec_of,
)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: bool = False  # logprob of each sampled token
    top_logprobs: int = 0  # and that many most likely alternatives (needs logprobs)
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    skip_special_tokens: bool = True
    # Logprobs of prompt tokens at positions >= prompt_logprobs_start (the
    # frontend's `select` scores continuations with them).
    prompt_logprobs: bool = False
    prompt_logprobs_start: int = 0
    # Structured output, at most one (radixserve/constrained/). json_schema takes a JSON
    # string, a dict or a pydantic model class and is stored as canonical JSON text;
    # choice is stored as a tuple. The compile happens at submit time (a bad schema is a
    # ValueError there); max_tokens running out first gives finish_reason "length" and
    # a prefix of a valid output.
    json_schema: Any = None
    regex: str | None = None
    ebnf: str | None = None
    choice: Sequence[str] | None = None
    # An xgrammar structural tag (dict or JSON text): free text with tagged parts that follow
    # their own grammars; tool calls constrain decoding with one (radixserve/chat_plan.py).
    structural_tag: Any = None
    # Append the strings the grammar forces without a forward pass per token.
    # None: the device's default (on on the CPU, off on CUDA; SchedulerConfig.
    # jump_forward_default) for constrained requests without logprobs or penalties.
    jump_forward: bool | None = None

    def __post_init__(self) -> None:
        # Accept lists/strings from callers but store immutable tuples (types checked on the way).
        object.__setattr__(self, "stop", V.stop_strings(self.stop))
        object.__setattr__(
            self, "stop_token_ids", V.token_ids("stop_token_ids", self.stop_token_ids, V.MAX_STOP_TOKEN_IDS)
        )
        object.__setattr__(self, "logit_bias", V.logit_bias(self.logit_bias))
        self._validate()
        _validate_grammar(self)

    def _validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {why}")

        _check_int(self, "max_tokens", 0)
        _check_int(self, "min_tokens", 0)
        _check_int(self, "n", 1, V.MAX_N)
        _check_int(self, "top_logprobs", 0, 20)
        _check_int(self, "prompt_logprobs_start", 0)
        # Any top_k >= 1 is accepted; the sampler clamps it to the vocabulary.
        if not (isinstance(self.top_k, int) and not isinstance(self.top_k, bool)) or (
            self.top_k != -1 and self.top_k < 1
        ):
            raise bad("top_k", "must be -1 (disabled) or an integer >= 1")
        if self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        _check_float(self, "temperature", 0.0, V.MAX_TEMPERATURE)
        _check_float(self, "top_p", 0.0, 1.0, low_open=True)
        _check_float(self, "min_p", 0.0, 1.0)
        _check_float(self, "frequency_penalty", -2.0, 2.0)
        _check_float(self, "presence_penalty", -2.0, 2.0)
        _check_float(self, "repetition_penalty", *V.REPETITION_PENALTY_RANGE)
        for name in ("include_stop_str_in_output", "ignore_eos", "logprobs", "skip_special_tokens"):
            V.check_bool(name, getattr(self, name))
        V.check_bool("prompt_logprobs", self.prompt_logprobs)
        if self.top_logprobs and not self.logprobs:
            raise bad("top_logprobs", "needs logprobs=True")
        if self.seed is not None and not _is_int(self.seed):
            raise bad("seed", "must be an integer or None")

    @property
    def greedy(self) -> bool:
        # Below a tiny temperature, sampling is greedy: logits / 1e-45 would overflow to NaN.
        return self.temperature < V.GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids must exist in the model's vocabulary (checked at submit time)."""
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", tuple(self.logit_bias))):
            for t in ids:
                if t >= vocab_size:
                    raise ValueError(
                        f"SamplingParams.{name}: token id {t} is outside the vocabulary ({vocab_size})"
                    )

    @property
    def grammar(self) -> GrammarSpec | None:
        """The output constraint (kind and canonical text), or None."""
        for kind in KINDS:
            value = getattr(self, kind)
            if value is not None:
                return spec_of(kind, value)
        return None

    @property
    def use_jump_forward(self) -> bool:
        """Jump-forward allowed: True, or None without logprobs and penalties (the device decides)."""
        if self.jump_forward is not None:
            return self.jump_forward and self.grammar is not None
        return self.grammar is not None and not self.logprobs and not self.uses_penalties

    def replace(self, **changes: Any) -> SamplingParams:
        from dataclasses import replace

        return replace(self, **changes)


def _validate_grammar(p: SamplingParams) -> None:
    """Structured-output fields: at most one, of the right shape, normalized in place."""
    given = [k for k in KINDS if getattr(p, k) is not None]
    if len(given) > 1:
        raise ValueError(f"SamplingParams: {', '.join(given)} are exclusive; give at most one")
    norm = {
        "json_schema": canonical_json_schema,
        "regex": check_regex,
        "ebnf": check_ebnf,
        "choice": canonical_choice,
        "structural_tag": canonical_structural_tag,
    }
    for kind in given:
        try:
            object.__setattr__(p, kind, norm[kind](getattr(p, kind)))
        except ValueError as e:
            raise ValueError(f"SamplingParams.{kind}: {e}") from None
    if p.jump_forward not in (None, True, False):
        raise ValueError(f"SamplingParams.jump_forward={p.jump_forward!r}: must be True, False or None")
    if p.jump_forward and (p.logprobs or p.uses_penalties):
        # Forced tokens are not sampled: they have no logprob and do not update penalty counts.
        raise ValueError("SamplingParams.jump_forward=True cannot be combined with logprobs or penalties")


def _is_int(v: Any) -> bool:
    return V.is_int(v)


def _check_int(p: SamplingParams, name: str, low: int, high: int | None = None) -> None:
    V.check_int(name, getattr(p, name), low, high)


def _check_float(p: SamplingParams, name: str, low: float, high: float, low_open: bool = False) -> None:
    # Stored as a float: an int the caller passed is converted once, here.
    object.__setattr__(p, name, V.check_float(name, getattr(p, name), low, high, low_open))

