"""FlashInfer plumbing shared by the backend's plans: the import, the guard that keeps
two plans of one wrapper from racing on its pinned buffer, and pinned plan inputs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch


def import_flashinfer() -> ModuleType:
    """The flashinfer module, or an ImportError that says how to get it."""
    try:
        import flashinfer
    except ImportError as e:
        raise ImportError(
            "the flashinfer attention backend needs the flashinfer-python package "
            "(pip install 'flashinfer-python>=0.3.1'; offline GPU machines: scripts/build_gpu_wheels.sh)"
        ) from e
    return flashinfer


class PlanGuard:
    """Waits until a wrapper's previous plan has left its pinned host buffer.

    FlashInfer's plan writes the schedule into a pinned host buffer and queues
    an async copy to the device without waiting. A second plan of the same
    wrapper before that copy ran would overwrite the first schedule; the event
    makes that impossible. Wrappers alternate between steps, so by the time a
    wrapper is planned again its copy is long done and the wait is free.
    """

    def __init__(self) -> None:
        self._event: torch.cuda.Event | None = None

    def before_plan(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def after_plan(self) -> None:
        if self._event is None:
            self._event = torch.cuda.Event()
        self._event.record()


@dataclass
class PlanSlot:
    wrapper: Any  # a FlashInfer wrapper (flashinfer has no type hints)
    guard: PlanGuard = field(default_factory=PlanGuard)


@dataclass
class FlashInferDecodeGraphState:
    """A decode wrapper with fixed-size page-table buffers for one batch size."""

    batch_size: int
    max_kv_tokens: int
    slot: PlanSlot
    kv_indptr: torch.Tensor  # [bs + 1] int32, device
    kv_indices: torch.Tensor  # [max_kv_tokens] int32, device (shared between states)
    last_page_len: torch.Tensor  # [bs] int32, device


def host_indptr(lengths: list[int]) -> torch.Tensor:
    # Pinned: FlashInfer copies plan inputs to the device with non_blocking=True,
    # which from pageable memory would wait for the whole stream (a hidden sync).
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32).pin_memory()


def pinned_ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.int32).pin_memory()
