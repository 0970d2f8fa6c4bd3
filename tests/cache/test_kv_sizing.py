"""How many KV slots an engine takes on a GPU (engine_build.kv_slots): `mem_fraction` of the
memory free beside the sampler's measured workspace, and, where not even one full context
fits, an error that says which context would. The device's free memory and the measured
workspace are stand-ins here (the measurement itself runs in tests/runtime/test_memory_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from radixserve import EngineConfig, engine_build

GIB = 1 << 30
CUDA = torch.device("cuda")


@pytest.fixture
def device_memory(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Free device memory and the sampler's workspace as the test sets them."""
    mem = {"free": 40 * GIB, "workspace": 2 * GIB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (mem["free"], 80 * GIB))
    monkeypatch.setattr(
        engine_build, "sampling_workspace_bytes", lambda rows, vocab, device: mem["workspace"]
    )
    return mem


def test_the_fraction_applies_to_memory_beside_the_sampler(device_memory: dict[str, int]) -> None:
    cfg = EngineConfig(model="m", mem_fraction=0.5)
    slots = engine_build.kv_slots(
        cfg, bytes_per_slot=1 << 20, device=CUDA, context_length=4096, vocab_size=1000
    )
    assert slots == (38 * GIB // 2) // (1 << 20) - 1  # half of 40 - 2 GiB, one slot kept for scratch


def test_too_little_memory_for_one_context_names_the_context_that_fits(device_memory: dict[str, int]) -> None:
    device_memory["free"] = 12 * GIB
    cfg = EngineConfig(model="m", mem_fraction=0.85)
    fits = int(10 * GIB * 0.85) // (1 << 18) - 1
    with pytest.raises(RuntimeError, match=f"pass context_length={fits} or less") as err:
        engine_build.kv_slots(
            cfg, bytes_per_slot=1 << 18, device=CUDA, context_length=131072, vocab_size=1000
        )
    assert "2.0 GiB of it for sampling 256 rows" in str(err.value)


def test_explicit_sizes_ignore_the_device(device_memory: dict[str, int]) -> None:
    device_memory["free"] = 0
    assert (
        engine_build.kv_slots(EngineConfig(model="m", kv_cache_tokens=5000), 1 << 18, CUDA, 4096, 1000)
        == 5000
    )


def test_no_room_to_sample_the_batch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(rows: int, vocab: int, device: torch.device) -> int:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    monkeypatch.setattr(engine_build, "sampling_workspace_bytes", oom)
    with pytest.raises(
        RuntimeError, match="sampling 256 rows of a 262144-token vocabulary .* lower max_running"
    ):
        engine_build.kv_slots(EngineConfig(model="m"), 1 << 18, CUDA, 4096, 262144)
