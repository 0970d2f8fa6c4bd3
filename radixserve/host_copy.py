"""Host-to-device copies that never stall the stream.

`torch.tensor(data, device="cuda")` copies from pageable memory, which CUDA
performs only after every kernel already queued on the stream has finished:
a hidden sync that defeats the overlap loop. Staging through pinned memory
with `non_blocking=True` queues the copy like any kernel instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch


def to_device(data: Sequence[float] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(data) if not isinstance(data, np.ndarray) else data, dtype=dtype)
    if device.type != "cuda":
        return t.to(device) if t.device != device else t
    return t.pin_memory().to(device, non_blocking=True)


class PinnedStaging:
    """A device buffer at a fixed address (CUDA graphs read it) refilled from the host without
    stalling: two pinned host buffers used in turn, each rewritten only once the copy that last
    read it has run (the host fills step k+1 while step k's copy may still be queued)."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.device_buf = torch.zeros(size, dtype=dtype, device=device)
        cuda = device.type == "cuda"
        self._host = [torch.zeros(size, dtype=dtype, pin_memory=cuda) for _ in range(2)]
        self._events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._turn = 0

    def upload(self, fill: Callable[[np.ndarray], None]) -> torch.Tensor:
        """`fill(host)` writes the whole host buffer (a numpy view); then one copy is queued
        into `device_buf` on the current stream."""
        self._turn ^= 1
        host, event = self._host[self._turn], self._events[self._turn]
        if event is not None:
            event.synchronize()  # two uploads old: done already, unless the device is far behind
        fill(host.numpy())
        self.device_buf.copy_(host, non_blocking=event is not None)
        if event is not None:
            event.record()
        return self.device_buf
