"""`Batch`: a launched step as the scheduler keeps it, to process its result.

`step` is what the runner gets (runtime/step.py, the one form of a step); the
other fields are what output processing needs and the runner does not: the
requests themselves, which of them sample, and for a decode step the
per-row stop facts as they were when it was built. `sched/batch_build.py`
makes both at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixserve.runtime.step import StepInput
from radixserve.sched.request import Request


@dataclass(frozen=True)
class Batch:
    reqs: list[Request]  # request i is row i of `step`
    step: StepInput
    sample: list[bool]  # request i samples a token at the end of its part
    # Per request, how many prompt-logprob rows it has (their targets: `step.prompt_lp_targets`).
    prompt_lp_counts: list[int] | None = None
    # Decode steps, for process(): whether each request is quiet, and its stop ids
    # ([B, k], padded with -2), as sched/sampling_rows.py had them when the step was built.
    quiet: np.ndarray | None = None
    stop_ids: np.ndarray | None = None

    @property
    def is_prefill(self) -> bool:
        """Not a plain decode step: some request may bring more than one token."""
        return not self.step.is_decode
