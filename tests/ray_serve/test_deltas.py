"""The stream a Ray replica sends (radixserve/ray/deltas.py): outputs without their cumulative
fields, joined back by the ingress into exactly the engine's outputs, n completions interleaved."""

from __future__ import annotations

import asyncio
import pickle

from radixserve import AsyncEngine, EngineConfig, SamplingParams
from radixserve.outputs import RequestOutput
from radixserve.ray.deltas import DeltaJoiner, as_delta


def test_joined_deltas_are_the_engine_outputs() -> None:
    params = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=24, logprobs=True, top_logprobs=2)

    async def run() -> list[RequestOutput]:
        async with AsyncEngine(EngineConfig(device="cpu", dtype="float32", stream_interval_ms=0)) as engine:
            return [o async for o in engine.generate("A list of fruits:", params)]

    outs = asyncio.run(run())
    assert len(outs) > 4 and {o.index for o in outs} == {0, 1}
    join = DeltaJoiner()
    for out in outs:
        wire = pickle.loads(pickle.dumps(as_delta(out)))  # what crosses between Ray's processes
        assert wire.text == "" and wire.token_ids == () and "_ids" not in wire.__dict__
        back = join(wire)
        assert (back.text, back.token_ids, back.logprobs) == (out.text, out.token_ids, out.logprobs)
        assert (back.index, back.finished, back.finish_reason, back.usage) == (
            out.index,
            out.finished,
            out.finish_reason,
            out.usage,
        )
    # The last delta of a long stream is as small as its first: nothing cumulative crosses.
    sizes = [len(pickle.dumps(as_delta(o))) for o in outs if not o.finished]
    assert max(sizes) < 4 * min(sizes)
