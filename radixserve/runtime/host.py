"""Host-to-device copies that never stall the stream.

`torch.tensor(data, device="cuda")` copies from pageable memory, which CUDA
performs only after every kernel already queued on the stream has finished:
a hidden sync that defeats the overlap loop. Staging through pinned memory
with `non_blocking=True` queues the copy like any kernel instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def to_device(data: Sequence[Any] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(data) if not isinstance(data, np.ndarray) else data, dtype=dtype)
    if device.type != "cuda":
        return t.to(device) if t.device != device else t
    return t.pin_memory().to(device, non_blocking=True)
