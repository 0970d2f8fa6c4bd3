"""Where the suite runs and how it drives an engine: models, configs, offline and streaming runs.

On a GPU the models are the dummy-weight shapes `dummy:qwen2.5-0.5b` (small)
and `dummy:llama-3.1-8b` (large) in bfloat16. With `--device cpu` both are a
tiny random Llama (a config.json and `load_format="dummy"`), float32, so the
whole suite runs in seconds on a laptop or in CI: those figures only show
that the code works, never speed.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from radixserve import AsyncEngine, EngineConfig, RequestOutput, SamplingParams

TINY_DIR = Path("/tmp/radixserve-suite/tiny-llama-dummy")


@dataclass(frozen=True)
class Target:
    device: str  # "cuda" or "cpu"
    dtype: str  # "bfloat16" on a GPU, "float32" on the CPU
    small: str  # model spec of the small model (host-bound on a GPU)
    large: str  # model spec of the large model (device-bound on a GPU)
    kv_cache_tokens: int | None = None  # None: from free GPU memory
    stream_interval: int = 1  # EngineConfig.stream_interval of every engine (gpu_suite --stream-interval)
    # EngineConfig fields set for every engine of the run (gpu_suite.py --set), to compare settings.
    overrides: tuple[tuple[str, Any], ...] = ()
    # EngineConfig.quantization of every engine (gpu_suite --quantization fp8). The transformers
    # twin (peer.py) stays unquantized on the same weights: correctness then measures FP8's drift.
    quantization: str | None = None
    # EngineConfig.deterministic of every engine (gpu_suite --deterministic): what W1 and the
    # others cost with batch-invariant kernels (docs/deterministic.md).
    deterministic: bool = False

    def name(self, spec: str) -> str:
        """The model's name in records: the shape without "dummy:", or the folder's name."""
        return spec.removeprefix("dummy:") if spec.startswith("dummy:") else Path(spec).name

    def config(self, spec: str, **kw: Any) -> EngineConfig:
        base: dict[str, Any] = dict(model=spec, device=self.device, dtype=self.dtype)
        base["load_format"] = load_format(spec)
        if self.kv_cache_tokens is not None:
            base["kv_cache_tokens"] = self.kv_cache_tokens
        if self.stream_interval != 1:
            base["stream_interval"] = self.stream_interval
        if self.quantization is not None:
            base["quantization"] = self.quantization
        if self.deterministic:
            base["deterministic"] = True
        base.update(self.overrides)
        base.update(kw)
        return EngineConfig(**base)

    def vocab(self, spec: str) -> int:
        return int(hf_config(spec).vocab_size)


def parse_override(text: str) -> tuple[str, Any]:
    """ "field=value" (`--set`) with the value read as a Python literal where it is one (8192, False)."""
    field, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--set {text!r}: expected FIELD=VALUE")
    try:
        return field, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return field, value


def load_format(spec: str) -> str:
    """ "dummy" for a config-only folder (random weights), else "auto"."""
    folder = Path(spec)
    if folder.is_dir() and not any(folder.glob("*.safetensors")):
        return "dummy"
    return "auto"


def hf_config(spec: str) -> Any:
    if spec.startswith("dummy:"):
        from radixserve.model.shapes import shape_hf_config

        return shape_hf_config(spec.removeprefix("dummy:"))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(spec)


def make_target(device: str) -> Target:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return Target("cuda", "bfloat16", "dummy:qwen2.5-0.5b", "dummy:llama-3.1-8b")
    tiny = tiny_config(TINY_DIR)
    return replace(Target("cpu", "float32", tiny, tiny), kv_cache_tokens=1 << 15)


def tiny_config(folder: Path) -> str:
    """A config-only folder of a tiny Llama (2 layers, vocab 512): random weights load instantly."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    cfg.save_pretrained(folder)
    return str(folder)


def free_memory() -> None:
    """Give a finished engine's device memory back before the next one sizes its KV pool."""
    if torch.cuda.is_available():  # on the CPU nothing waits on it (and gc.collect is slow there)
        gc.collect()
        torch.cuda.empty_cache()


@contextmanager
def running_engine(cfg: EngineConfig) -> Iterator[tuple[AsyncEngine, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    engine = AsyncEngine(cfg)
    t0 = time.perf_counter()
    loop.run_until_complete(engine.start())
    # A step cut off by its time limit then shows whether the start (weights, kernel builds,
    # graph capture) or the requests took the time.
    print(f"engine {cfg.model}: started in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        yield engine, loop
    finally:
        loop.run_until_complete(engine.shutdown(drain=False))
        loop.close()
        del engine
        free_memory()


def one(out: RequestOutput | list[RequestOutput]) -> RequestOutput:
    """The single output of an n=1 request (`complete()` returns a list only for n > 1)."""
    assert not isinstance(out, list)
    return out


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def sampled(n: int, seed: int) -> SamplingParams:
    """W1's sampled setting: temperature 0.8, top_p 0.95, a seed per request."""
    return SamplingParams(temperature=0.8, top_p=0.95, seed=seed, max_tokens=n, ignore_eos=True)


def run_offline(
    engine: AsyncEngine,
    loop: asyncio.AbstractEventLoop,
    reqs: list[tuple[list[int], int]],
    sample: bool = False,
    progress_s: float = 0.0,
) -> float:
    """`complete()` every request at once: output tokens per second, first submit to last token.
    `sample`: each request samples (`sampled`, seeded by its index) instead of greedy.
    `progress_s` > 0: a line every so many seconds (requests done, their tokens per second so
    far), so that a run cut off by a timeout still says how far it got."""

    def params(i: int, n: int) -> SamplingParams:
        return sampled(n, seed=i) if sample else greedy(n)

    done = [0, 0]  # requests finished, their output tokens

    async def request(i: int, ids: list[int], n: int) -> None:
        out = one(await engine.complete(ids, params(i, n)))
        done[0] += 1
        done[1] += len(out.token_ids)

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_s)
            t = time.perf_counter() - t0
            rate = done[1] / t
            print(f"  {done[0]}/{len(reqs)} requests done after {t:.0f} s: {rate:,.0f} tok/s", flush=True)

    async def go() -> None:
        reporter = asyncio.ensure_future(report()) if progress_s > 0 else None
        try:
            await asyncio.gather(*(request(i, ids, n) for i, (ids, n) in enumerate(reqs)))
        finally:
            if reporter is not None:
                reporter.cancel()

    t0 = time.perf_counter()
    loop.run_until_complete(go())
    return done[1] / (time.perf_counter() - t0)


@dataclass(frozen=True)
class Streamed:
    tok_s: float
    ttft: list[float]  # seconds, per request
    tbt: list[float]  # seconds between tokens (a multi-token delta counts as equal gaps)


def run_streaming(
    engine: AsyncEngine,
    loop: asyncio.AbstractEventLoop,
    reqs: list[tuple[list[int], int]],
    delays: list[float] | None = None,
) -> Streamed:
    """Every request consumed with `async for` over `generate()`, submitted at `delays` (default 0)."""
    ttft: list[float] = []
    tbt: list[float] = []

    async def one(ids: list[int], n: int, delay: float) -> int:
        if delay:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        last, got = None, 0
        async for out in engine.generate(ids, greedy(n)):
            now, k = time.perf_counter(), len(out.delta_token_ids)
            got += k
            if last is None:
                ttft.append(now - t0)
            elif k:
                tbt.extend([(now - last) / k] * k)
            last = now
        return got

    async def go() -> int:
        ds = delays or [0.0] * len(reqs)
        return sum(await asyncio.gather(*(one(i, n, d) for (i, n), d in zip(reqs, ds))))

    t0 = time.perf_counter()
    n = loop.run_until_complete(go())
    return Streamed(n / (time.perf_counter() - t0), ttft, tbt)


def p50_p99_ms(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        v = 1000 * xs[0] if xs else float("nan")
        return v, v
    return 1000 * statistics.median(xs), 1000 * statistics.quantiles(xs, n=100)[98]


def stats(engine: AsyncEngine, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    return dict(loop.run_until_complete(engine.stats()))
