"""How many radixserve functions one request passes through, from `AsyncEngine.generate` to its
first streamed output: a measure of how far a newcomer reads to follow a request.

A profiler hook (the event loop's thread and the worker thread) records every call into a
`radixserve/` function while one request, on an idle engine, goes from `generate()` to the
first output it yields. Prints the distinct functions and files, and writes JSON.

    python benchmarks/call_path.py --out benchmarks/results/call_path.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from pathlib import Path
from types import FrameType

from radixserve import AsyncEngine, EngineConfig, SamplingParams


class CallRecorder:
    def __init__(self) -> None:
        self.on = False
        self.calls: dict[str, int] = {}  # "file:function" -> calls

    def hook(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.on or event != "call":
            return
        path = frame.f_code.co_filename
        i = path.rfind("/radixserve/")
        if i < 0:
            return
        key = f"{path[i + 1 :]}:{frame.f_code.co_qualname}"
        self.calls[key] = self.calls.get(key, 0) + 1


async def first_output(rec: CallRecorder, prompt: str) -> None:
    async with AsyncEngine(EngineConfig(device="cpu", dtype="float32")) as engine:
        await engine.complete(prompt, SamplingParams(max_tokens=2))  # warm: imports, first compiles
        rec.on = True
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=4, temperature=0.0)):
            rec.on = False
            break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--out", default=None, help="write the JSON record here")
    args = ap.parse_args()
    rec = CallRecorder()
    threading.setprofile(rec.hook)  # the worker thread, started inside the engine
    sys.setprofile(rec.hook)
    try:
        asyncio.run(first_output(rec, args.prompt))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    files = sorted({k.split(":")[0] for k in rec.calls})
    record = {"functions": len(rec.calls), "files": len(files), "calls": rec.calls}
    print(f"{'functions':>10} {'files':>6}\n{len(rec.calls):>10} {len(files):>6}")
    for f in files:
        print(f"  {f}: {sum(1 for k in rec.calls if k.startswith(f + ':'))}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
