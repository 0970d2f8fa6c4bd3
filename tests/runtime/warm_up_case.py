"""An engine started on the Triton attention backend under the interpreter, for
test_warm_up.py: `TRITON_INTERPRET=1 python warm_up_case.py <model folder>` prints one JSON
object: the start-up's progress lines, the tokens of a few greedy requests, and the builds of
the "flashinfer" backend for a windowed model (the Triton hybrid: each half's own)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import torch

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.cache.kv_pool import KVPool, KVPoolConfig
from radixserve.runtime.attention import AttentionOptions, make_attention_backend


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def serve(folder: str) -> list[list[int]]:
    cfg = EngineConfig(
        model=folder,
        load_format="dummy",
        attention_backend="triton",
        kv_cache_tokens=2048,
        cascade_attention=True,
    )
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    async with AsyncEngine(cfg) as engine:
        outs = await asyncio.gather(*(engine.complete(list(range(1, 4 + 9 * i)), params) for i in range(3)))
    return [list(o.token_ids) for o in outs]  # type: ignore[union-attr]


def hybrid_builds() -> list[tuple[str, str]]:
    pool = KVPool(KVPoolConfig(2, 2, 16), 64)
    options = AttentionOptions(windows=(8, None))
    attn = make_attention_backend("flashinfer", pool, 4, 2, 16, 0.25, options=options)
    builds = attn.kernel_builds(cascade=True)
    for b in builds:
        b.run()
    return [(b.label, b.step) for b in builds]


if __name__ == "__main__":
    torch.manual_seed(0)
    handler = Lines()
    logger = logging.getLogger("radixserve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    tokens = asyncio.run(serve(sys.argv[1]))
    print(json.dumps({"lines": handler.lines, "tokens": tokens, "hybrid": hybrid_builds()}))
