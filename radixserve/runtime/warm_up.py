"""Kernel builds at start-up: every JIT-compiled module the engine's steps run, built (or
loaded from its cache) before the engine serves, with one progress line each.

FlashInfer (0.3.x) compiles each attention, norm, rope and activation module on its first
call, into `$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer` (default: the home folder); on a
fresh machine that took 22-28 s of the first requests' time to first token (H200). Triton
compiles our kernels on first launch too (into `~/.triton/cache`), a second or two each.
So the attention backend (`AttentionBackend.kernel_builds`), the layer kernels
(`TorchKernels.kernel_builds`) and the runner (one tiny model step on CUDA, for whatever
else compiles: fused MoE, FP8) each list what they run, as `KernelBuild`s that run it once
on a tiny input; `run_builds` runs them in order at start, before CUDA-graph capture. A
cached module loads in well under a second, so a warm machine pays little.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

log = logging.getLogger(__name__)

# Which steps need a build: a backend made of halves (hybrid.py) keeps each half's own.
StepKind = Literal["extend", "decode", "cascade", "any"]

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class KernelBuild:
    label: str  # what is built, for the progress line: "flashinfer batch_prefill (fa2) bf16 head_dim 128"
    run: Callable[[], None]  # runs the kernel once on a tiny input, which builds or loads it
    step: StepKind = "any"


class KernelBuildError(RuntimeError):
    """A kernel failed to build or run at start-up; the message names which."""


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def run_builds(builds: Sequence[KernelBuild], device: torch.device) -> float:
    """Run each build once, in order (a label seen before is skipped), logging one line per
    build at INFO; the seconds it all took. Raises `KernelBuildError` naming the failed one."""
    unique = list({b.label: b for b in builds}.values())
    n = len(unique)
    start = time.perf_counter()
    for i, build in enumerate(unique, 1):
        t0 = time.perf_counter()
        try:
            build.run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # a launch error belongs to this build, not the next
        except Exception as e:
            raise KernelBuildError(
                f"radixserve: compiling kernels ({i}/{n}: {build.label}) failed: {type(e).__name__}: {e}"
            ) from e
        log.info(
            "radixserve: compiling kernels (%d/%d: %s)... %.1f s", i, n, build.label, time.perf_counter() - t0
        )
    total = time.perf_counter() - start
    if n:
        log.info("radixserve: kernels ready (%d built or loaded in %.1f s)", n, total)
    else:
        log.info("radixserve: kernels ready (nothing to compile)")
    return total
