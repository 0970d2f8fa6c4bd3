"""How `select` picks among choices from their token logprobs (SGLang's three methods).

A method is called as SGLang calls one (sglang/lang/choices.py), with keyword
arguments: `choices`, `normalized_prompt_logprobs` (each choice's mean token
logprob), `input_token_logprobs` (per choice, its tokens' (logprob, id, text)
given the prompt), `output_token_logprobs` (empty lists: nothing is generated)
and `unconditional_token_logprobs` (the same tokens without the prompt, when the
method's `requires_unconditional_logprobs`). It returns a decision with the
numbers it used, which become the select's meta_info. So SGLang's own method
objects (`sglang.greedy_token_selection`, ...) work here as well as ours.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from radixserve.lang.backend import TokenLogprob


@dataclass(frozen=True)
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class Decision(Protocol):
    """What a method returns: ours (`ChoicesDecision`) or SGLang's."""

    @property
    def decision(self) -> str: ...

    @property
    def meta_info(self) -> dict[str, Any] | None: ...


@runtime_checkable
class ChoicesMethod(Protocol):
    """Anything `select(choices_method=...)` takes: our methods or SGLang's."""

    @property
    def requires_unconditional_logprobs(self) -> bool: ...

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Any]],
        output_token_logprobs: list[list[Any]],
        unconditional_token_logprobs: list[list[Any]] | None = None,
    ) -> Decision: ...


def _argmax_first(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def mean_logprob(tokens: Sequence[Sequence[Any]]) -> float:
    """The mean logprob of (logprob, id, text) entries (SGLang's normalized prompt logprob)."""
    return sum(t[0] for t in tokens) / len(tokens) if tokens else float("-inf")


class ChoicesSamplingMethod(ABC):
    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Any]],
        output_token_logprobs: list[list[Any]],
        unconditional_token_logprobs: list[list[Any]] | None = None,
    ) -> ChoicesDecision: ...


def _meta(normalized: list[float], inputs: list[list[Any]], outputs: list[list[Any]]) -> dict[str, Any]:
    return {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": inputs,
        "output_token_logprobs": outputs,
    }


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob (SGLang's default)."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Any]],
        output_token_logprobs: list[list[Any]],
        unconditional_token_logprobs: list[list[Any]] | None = None,
    ) -> ChoicesDecision:
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        return ChoicesDecision(choices[_argmax_first(normalized_prompt_logprobs)], meta)


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare token by token: keep the choices with the best logprob at each position
    (a shorter choice is padded with its own mean) until one is left."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Any]],
        output_token_logprobs: list[list[Any]],
        unconditional_token_logprobs: list[list[Any]] | None = None,
    ) -> ChoicesDecision:
        rows = [[float(t[0]) for t in c] for c in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [mean_logprob(c)] * (width - len(r)) for r, c in zip(rows, input_token_logprobs)]
        alive = list(range(len(rows)))
        for j in range(width):
            best = max(matrix[i][j] for i in alive)
            alive = [i for i in alive if matrix[i][j] == best]
            if len(alive) == 1:
                break
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["greedy_logprob_matrix"] = matrix
        return ChoicesDecision(choices[alive[0]], meta)


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice whose tokens gain most from the prompt: mean of logprob(token | prompt)
    minus logprob(token | nothing); the first token has no unconditional logprob (0)."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[Any]],
        output_token_logprobs: list[list[Any]],
        unconditional_token_logprobs: list[list[Any]] | None = None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional token logprobs")
        values = []
        for c, u in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(u) != len(c):
                raise ValueError(
                    f"unconditional_likelihood_normalized: {len(u)} unconditional logprobs "
                    f"for {len(c)} tokens"
                )
            uncond = [t[0] for t in u]
            if uncond:
                uncond[0] = uncond[0] or 0.0  # SGLang's server gives None there
            values.append(sum(t[0] - x for t, x in zip(c, uncond)) / len(c))
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        meta["normalized_unconditional_prompt_logprobs"] = values
        return ChoicesDecision(choices[_argmax_first(values)], meta)


def decide(
    method: ChoicesMethod,
    choices: Sequence[str],
    scored: Sequence[Sequence[TokenLogprob]],
    unconditional: Sequence[Sequence[TokenLogprob]] | None,
) -> Decision:
    """Call `method` the way SGLang's interpreter does, on each choice's token logprobs."""
    inputs = [list(c) for c in scored]
    return method(
        choices=list(choices),
        normalized_prompt_logprobs=[mean_logprob(c) for c in inputs],
        input_token_logprobs=inputs,
        output_token_logprobs=[[] for _ in inputs],
        unconditional_token_logprobs=None if unconditional is None else [list(u) for u in unconditional],
    )


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
