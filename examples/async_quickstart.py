"""Async streaming quickstart: the README's first example, runnable.

    python examples/async_quickstart.py [--max-tokens 64] [--model PATH]

One `AsyncEngine` in this program's event loop: `async with` starts its worker
thread and, on exit, lets running requests finish and stops it. The second
request is a chat whose template prefix the first request already computed,
so part of its prompt comes from the radix cache (`usage.cached_tokens`).
"""

from __future__ import annotations

import argparse
import asyncio

from radixserve import AsyncEngine, EngineConfig, RequestOutput, SamplingParams


async def main(
    max_tokens: int = 64, model: str = "smollm2-135m-instruct", device: str = "auto"
) -> RequestOutput:
    engine = AsyncEngine(EngineConfig(model=model, device=device))
    async with engine:
        chat = [{"role": "user", "content": "Tell me a joke"}]
        async for out in engine.generate(chat, SamplingParams(max_tokens=max_tokens, seed=0)):
            print(out.delta_text, end="", flush=True)  # tokens as they are produced
        print()
        final = await engine.complete(
            [{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=max_tokens)
        )
        assert isinstance(final, RequestOutput)  # a list only when n > 1
        print(final.text)
        print(f"cached_tokens={final.usage.cached_tokens} finish_reason={final.finish_reason}")
        return final


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--max-tokens", type=int, default=64)
    cli.add_argument("--model", default="smollm2-135m-instruct")
    cli.add_argument("--device", default="auto")
    args = cli.parse_args()
    asyncio.run(main(args.max_tokens, args.model, args.device))
