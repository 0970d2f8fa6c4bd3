"""The checks `EngineConfig` and `RouterConfig` run when they are built (radixserve/config.py).

A config is checked in the caller's thread, so a value the engine cannot use fails there with
its name, never in the worker at the first request. Each check takes the value and the name the
message shows ("EngineConfig.page_size"); a bool is no number here, though Python's int it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def check_int(name: str, v: object, minimum: int = 1, optional: bool = False) -> None:
    """An int >= `minimum` (or None when `optional`)."""
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        none = "None or " if optional else ""
        raise ValueError(f"{name}={v!r}: must be {none}an integer >= {minimum}")


def check_number(name: str, v: object, low: float, high: float, what: str, low_open: bool = False) -> None:
    """A real number in [low, high] (`low_open`: (low, high]); NaN is outside every range.
    `what` ends the message: "must be <what>"."""
    number = isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
    if not number or not (low < v if low_open else low <= v) or not v <= high:  # type: ignore[operator]
        raise ValueError(f"{name}={v!r}: must be {what}")


def check_choice(name: str, v: object, choices: Sequence[object]) -> None:
    if v not in choices:
        *head, last = map(repr, choices)
        listed = f"{', '.join(head)} or {last}" if head else last
        raise ValueError(f"{name}={v!r}: use {listed}")


def check_deterministic(
    deterministic: object,
    quantization: str | None,
    kv_cache_dtype: str,
    attention_backend: str,
    cascade_attention: bool | None,
) -> None:
    """`EngineConfig.deterministic` against the settings that have no batch-invariant kernel."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"EngineConfig.deterministic={deterministic!r}: use True or False")
    if not deterministic:
        return
    if quantization is not None:
        raise ValueError(
            f"EngineConfig.deterministic=True with quantization={quantization!r}: the FP8 "
            "product has no batch-invariant kernel; use quantization=None"
        )
    if kv_cache_dtype != "auto":
        raise ValueError(
            f"EngineConfig.deterministic=True with kv_cache_dtype={kv_cache_dtype!r}: the "
            "batch-invariant attention reads the model's dtype; use kv_cache_dtype='auto'"
        )
    if attention_backend == "flashinfer":
        raise ValueError(
            "EngineConfig.deterministic=True with attention_backend='flashinfer': its prefill splits "
            "a request's keys at the cached prefix (docs/deterministic.md); use 'auto', 'triton' or 'torch'"
        )
    if cascade_attention:
        raise ValueError("EngineConfig.deterministic=True with cascade_attention=True: use None or False")


def checked_replicas(size: object, devices: object) -> tuple[str, ...] | None:
    """`EngineConfig.data_parallel_size` and `data_parallel_devices` together; the devices as a
    tuple (a list given is frozen), or None."""
    check_int("EngineConfig.data_parallel_size", size, optional=True)
    if devices is None:
        return None
    if (
        isinstance(devices, str)
        or not isinstance(devices, (list, tuple))
        or not devices
        or not all(isinstance(d, str) for d in devices)
    ):
        raise ValueError(
            f"EngineConfig.data_parallel_devices={devices!r}: must be None or device names, "
            "e.g. ('cuda:0', 'cuda:1')"
        )
    if size is not None and size != len(devices):
        raise ValueError(
            f"EngineConfig.data_parallel_size={size} but data_parallel_devices names {len(devices)}"
        )
    return tuple(devices)
