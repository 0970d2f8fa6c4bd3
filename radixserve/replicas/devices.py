"""Each replica's own `EngineConfig`: the shared one, on its device, without replicas."""

from __future__ import annotations

from dataclasses import replace

import torch

from radixserve.config import EngineConfig


def replica_devices(cfg: EngineConfig) -> tuple[str, ...]:
    """The device of each replica: `data_parallel_devices` as listed; else on a GPU the first
    `data_parallel_size` visible ones (cuda:0, cuda:1, ...); else the CPU, once per replica."""
    if cfg.data_parallel_devices is not None:
        return cfg.data_parallel_devices
    n = cfg.data_parallel_size or 1
    device = cfg.torch_device()
    if device.type != "cuda":
        return (str(device),) * n
    if device.index is not None and n > 1:
        raise ValueError(
            f"EngineConfig.device={cfg.device!r} names one GPU for {n} replicas: "
            "list them in data_parallel_devices, or use device='cuda'"
        )
    if device.index is not None:
        return (str(device),)
    visible = torch.cuda.device_count()
    if n > visible:
        raise ValueError(
            f"EngineConfig.data_parallel_size={n}: only {visible} GPU(s) are visible; "
            "list the devices in data_parallel_devices to put several replicas on one GPU"
        )
    return tuple(f"cuda:{i}" for i in range(n))


def replica_configs(cfg: EngineConfig) -> list[EngineConfig]:
    """One plain engine's config per replica (each checks its own device when it starts)."""
    return [
        replace(cfg, device=d, data_parallel_size=None, data_parallel_devices=None)
        for d in replica_devices(cfg)
    ]
