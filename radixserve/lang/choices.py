"""How `select` picks among choices from their token logprobs (SGLang's three methods).

Each method gets, per choice, the logprobs of the choice's tokens given the
prompt (and for the unconditional method, without it) and returns the decision
with the numbers it used, which become the select's meta_info.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve.lang.backend import ChoiceLogprobs


@dataclass(frozen=True)
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _argmax_first(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


class ChoicesSamplingMethod(ABC):
    requires_unconditional_logprobs: bool = False

    @abstractmethod
    def __call__(self, choices: Sequence[str], scored: Sequence[ChoiceLogprobs]) -> ChoicesDecision: ...

    @staticmethod
    def _base_meta(scored: Sequence[ChoiceLogprobs]) -> dict[str, Any]:
        return {
            "normalized_prompt_logprobs": [_mean([t[0] for t in c.token_logprobs]) for c in scored],
            "input_token_logprobs": [c.token_logprobs for c in scored],
            "output_token_logprobs": [[] for _ in scored],
        }


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob (SGLang's default)."""

    def __call__(self, choices: Sequence[str], scored: Sequence[ChoiceLogprobs]) -> ChoicesDecision:
        meta = self._base_meta(scored)
        return ChoicesDecision(choices[_argmax_first(meta["normalized_prompt_logprobs"])], meta)


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare token by token: keep the choices with the best logprob at each position
    (a shorter choice is padded with its own mean) until one is left."""

    def __call__(self, choices: Sequence[str], scored: Sequence[ChoiceLogprobs]) -> ChoicesDecision:
        rows = [[t[0] for t in c.token_logprobs] for c in scored]
        width = max(len(r) for r in rows)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        alive = list(range(len(rows)))
        for j in range(width):
            best = max(matrix[i][j] for i in alive)
            alive = [i for i in alive if matrix[i][j] == best]
            if len(alive) == 1:
                break
        meta = self._base_meta(scored)
        meta["greedy_logprob_matrix"] = matrix
        return ChoicesDecision(choices[alive[0]], meta)


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice whose tokens gain most from the prompt: mean of logprob(token | prompt)
    minus logprob(token | nothing); the first token has no unconditional logprob (0)."""

    requires_unconditional_logprobs = True

    def __call__(self, choices: Sequence[str], scored: Sequence[ChoiceLogprobs]) -> ChoicesDecision:
        values = []
        for c in scored:
            if c.unconditional is None or len(c.unconditional) != len(c.token_logprobs):
                raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
            uncond = [t[0] for t in c.unconditional]
            if uncond:
                uncond[0] = uncond[0] or 0.0
            values.append(_mean([t[0] - u for t, u in zip(c.token_logprobs, uncond)]))
        meta = self._base_meta(scored)
        meta["unconditional_token_logprobs"] = [c.unconditional for c in scored]
        meta["normalized_unconditional_prompt_logprobs"] = values
        return ChoicesDecision(choices[_argmax_first(values)], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
