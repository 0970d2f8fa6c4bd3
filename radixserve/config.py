"""`EngineConfig`: everything an engine is built from, in one frozen dataclass.

Each component takes only its own part (`scheduler_config()`), so there is no
global configuration object to reach into.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from radixserve.config_checks import (
    check_choice,
    check_deterministic,
    check_int,
    check_number,
    checked_replicas,
)
from radixserve.sched.config import SchedulerConfig

ROUTER_POLICIES = ("cache_aware", "round_robin", "least_loaded")
QUANTIZATIONS = (None, "fp8")
KVCacheDtype = Literal["auto", "fp8_e4m3"]
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KVCacheDtype)
ATTENTION_BACKENDS = ("auto", "flashinfer", "triton", "torch")
CASCADE_SIZES = ("cascade_min_shared", "cascade_min_saved")
KV_SIZES = ("kv_cache_tokens", "kv_cache_bytes", "context_length")  # None: sized by the engine
GRAMMAR_SIZES = (
    "grammar_cache_size",
    "grammar_cache_bytes",
    "grammar_compile_workers",
    "grammar_max_abandoned",
)


@dataclass(frozen=True)
class RouterConfig:
    """How an engine of replicas spreads requests (`EngineConfig.router`; radixserve/replicas/)."""

    # "cache_aware": to the replica that holds the longest prefix of the prompt, unless it is
    # too loaded (below); "round_robin": in turn; "least_loaded": fewest requests in flight.
    policy: str = "cache_aware"
    # A prefix counts when it covers at least this share of the prompt (SGLang's router's
    # default); below it the least loaded replica takes the request, spreading new prefixes.
    cache_threshold: float = 0.5
    # The prefix's replica is too loaded when its requests in flight exceed the least loaded
    # replica's by more than `balance_abs` and by more than a factor `balance_rel` (both: a
    # small absolute gap is noise, a small ratio at high load costs little queueing).
    balance_abs: int = 32
    balance_rel: float = 1.5
    # Tokens the router's index remembers per replica; None: the replica's KV pool size (its
    # radix cache can never hold more).
    index_tokens: int | None = None

    def __post_init__(self) -> None:
        check_choice("RouterConfig.policy", self.policy, ROUTER_POLICIES)
        check_number("RouterConfig.cache_threshold", self.cache_threshold, 0.0, 1.0, "a share in [0, 1]")
        check_int("RouterConfig.balance_abs", self.balance_abs, minimum=0)
        check_number("RouterConfig.balance_rel", self.balance_rel, 1.0, math.inf, "a factor >= 1")
        check_int("RouterConfig.index_tokens", self.index_tokens, optional=True)


GPU_CHUNK = 8192  # default prefill chunk on a GPU (tokens)
CPU_CHUNK = 512  # on the CPU: see BENCHMARKS.md ("Prefill chunk on the CPU")
# Logits a step may add for prompt logprobs (rows x vocabulary; with their bf16 source and
# log-softmax ~10 bytes each: ~1.3 GB), unless EngineConfig.prompt_logprob_rows says.
PROMPT_LOGPROB_LOGITS = 1 << 27


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m-instruct"  # embedded name, "dummy:<shape>", HF folder or .gguf file
    load_format: str = "auto"  # "auto" or "dummy" (random weights for a named shape)
    dtype: str = "auto"  # "auto" (float32 on CPU, bfloat16 on GPU), "float32", "bfloat16", "float16"
    device: str = "auto"  # "auto" (cuda when available), "cpu", "cuda", "cuda:1"
    # "fp8": the decoder layers' linear weights quantized at load to float8_e4m3fn, one scale
    # per output channel, activations per token (docs/fp8.md; CUDA needs compute capability
    # >= 8.9, the CPU runs the dequantizing reference). None: weights as the checkpoint stores
    # them (an FP8 checkpoint loads as FP8 either way).
    quantization: str | None = None
    # The KV cache's element type. "auto": the model's dtype. "fp8_e4m3": float8_e4m3fn with a
    # K and a V scale per layer (the checkpoint's `k_scale` / `v_scale` when it has them, else
    # 1.0): twice the tokens in the same memory, attention reads them back in the model dtype
    # (docs/fp8.md). CUDA needs compute capability >= 8.9; the CPU runs the torch reference.
    kv_cache_dtype: KVCacheDtype = "auto"
    overlap: bool = True  # RADIXSERVE_DISABLE_OVERLAP=1 turns it off
    # Prefill tokens per step; long prompts go in chunks of this. None: per device (CPU_CHUNK on
    # the CPU, where a forward of 8192 tokens takes minutes and stalls everyone; GPU_CHUNK on a GPU).
    chunked_prefill_size: int | None = None
    # A step carries every running request's decode token and, in the rest of the chunk budget,
    # prefill chunks ("mixed"), so arrivals do not pause the others. False: prefill first (a step
    # is prefill or decode; chunks and decode steps alternate).
    mixed_steps: bool = True
    # Prefill tokens at most in a step that also decodes (mixed steps): each decoding request
    # waits for the whole step, so this bounds its time between tokens while prompts arrive
    # (W4 in BENCHMARKS.md). Steps with nothing to decode, and steps while more than a chunk
    # of prompt tokens waits (a burst: throughput first), take a whole chunk. None: no cap.
    mixed_prefill_tokens: int | None = 512
    max_running_requests: int = 256
    # Prompt positions one step may score (prompt logprobs): a long prompt's scored part goes
    # in chunks of this many. None: PROMPT_LOGPROB_LOGITS over the vocabulary size (1,024 rows
    # of a 128k vocabulary), at least max_running_requests.
    prompt_logprob_rows: int | None = None
    # Tokens per streamed output, as SGLang's `--stream-interval`: `generate()` yields a
    # request's first token at once, then an output every this many tokens and always the
    # final one; the tokens and text in between come in the next output's deltas. Each output
    # costs host work on the worker and on the event loop (about 50 µs per streamed token
    # at 1, BENCHMARKS.md "Streaming against `complete()`"), which a fast GPU waits for;
    # larger values trade smoothness for throughput. `complete()` is unaffected.
    stream_interval: int = 1
    # ...and at least this many milliseconds after the previous output (0: no such floor).
    # Tokens that come faster ride together in the next output, so a fast model's streams
    # cost host work per output, not per token (at most 1000 / stream_interval_ms outputs a
    # second per stream), while one slower than this still streams every token.
    stream_interval_ms: float = 20.0
    # Seconds one worker step may run, with requests waiting, before the engine is declared
    # stalled: pending requests fail with EngineStalledError, `healthy` turns False until the
    # step ends (radixserve/watchdog.py). None: no watchdog. Longer than any honest step (a
    # first step that compiles GPU kernels, a large prefill chunk on a slow CPU).
    watchdog_timeout_s: float | None = 120.0
    kv_cache_tokens: int | None = None  # KV pool size in tokens; None: from kv_cache_bytes or memory
    kv_cache_bytes: int | None = None
    mem_fraction: float = 0.85  # GPU: share of free memory (after weights, sampling) for the KV pool
    page_size: int = 1
    enable_radix_cache: bool = True
    context_length: int | None = None  # default: the model's max positions
    attention_backend: str = "auto"  # "auto", "flashinfer", "triton", "torch"
    # Decode steps of the FlashInfer backend: "auto" runs our Triton split-K kernel when triton
    # is installed (1.1-1.5x faster per layer on the H200, no per-step host plan; BENCHMARKS.md),
    # "flashinfer" FlashInfer's decode wrapper. Prefill and extend steps are FlashInfer's either way.
    decode_kernel: str = "auto"
    cuda_graph: bool = True
    # Extend steps (prefill chunks, mixed prefill + decode steps) of up to this many new tokens
    # replay CUDA graphs too (runtime/extend_graphs.py; FlashInfer and Triton backends, with
    # triton installed); 0: they run eagerly. Larger steps keep the device busy on their own.
    extend_graph_tokens: int = 2048
    # Norm, rotary and SiLU-and-mul: "auto" takes FlashInfer's fused kernels on CUDA in
    # float16/bfloat16 (fewer, larger kernels per layer), else the torch reference
    # (transformers' arithmetic, used on the CPU); "flashinfer" or "torch" to force one.
    layer_kernels: str = "auto"
    # Shared-prefix (cascade) decode attention: requests that share at least
    # `cascade_min_shared` leading tokens in the radix tree read that prefix's K/V once per
    # group, in steps where the groups save at least `cascade_min_saved` slot reads per layer
    # (with the Triton decode such steps replay CUDA graphs of their own; with FlashInfer's
    # decode kernel or the torch backend they run eagerly). Every backend has it.
    # None (the default): on where cascade steps replay CUDA graphs (a CUDA device with the
    # Triton decode and `cuda_graph`, the GPU default), off elsewhere. On the H200 it made W2
    # 1.08x and W5's decode steps 1.14x / 1.59x faster and left the step period of batches
    # that share nothing unchanged (BENCHMARKS.md, the H200 suite); eager cascade steps cost more
    # host time than they save, and the CPU keeps transformers' plain attention arithmetic.
    cascade_attention: bool | None = None
    cascade_min_shared: int = 256
    cascade_min_saved: int = 4096
    # Admission keeps this fraction of every running request's remaining tokens free in the KV
    # pool (0 to 1). Low admits more and sends the shortest back to the queue when the pool runs
    # dry; 1.0 never over-admits, the choice when requests rarely stop early (ignore_eos).
    decode_reserve_ratio: float = 0.25
    # Chat outputs (radixserve/chat_plan.py): the tool-call format, "auto" for the chat
    # template's (the default tool prompt's Hermes format when it has none) or a name of
    # `radixserve.tools.tool_parser_names()`; the reasoning block's, "auto" for "qwen3" when
    # the template writes `<think>`, a name of `reasoning_parser_names()`, or None: never split.
    tool_call_parser: str = "auto"
    reasoning_parser: str | None = "auto"
    grammar_compile_timeout: float = 60.0  # seconds a request waits for its grammar to compile
    grammar_cache_size: int = 512  # compiled grammars (and compile failures) kept, LRU
    # ...and at most this much memory of compiled grammars (xgrammar's estimate): a schema
    # with a large enum can hold over 100 MB. A larger grammar serves its requests, unkept.
    grammar_cache_bytes: int = 1 << 30
    # Grammar compiles run on threads of their own, at most this many at once (more wait).
    grammar_compile_workers: int = 2
    # Compiles that ran past the timeout cannot be stopped: they run on, unwaited for. While
    # this many do, new grammars are refused (a ValueError; cached grammars still serve).
    grammar_max_abandoned: int = 2
    # Replicas (radixserve/replicas/): None runs one engine. N runs N engines, each with its
    # own worker thread, on `data_parallel_devices` (else cuda:0..N-1 on a GPU, N times the
    # CPU), behind one AsyncEngine and a router (`router`); 1 is one engine behind the router.
    data_parallel_size: int | None = None
    data_parallel_devices: tuple[str, ...] | None = None
    router: RouterConfig = field(default_factory=RouterConfig)
    # Batch-invariant computation (docs/deterministic.md): a request's tokens (greedy, or
    # sampled with a seed) do not depend on what else runs in its steps, nor on how its
    # prompt was chunked or cached. Linear layers and attention run kernels of one fixed
    # shape per row (slower); no cascade attention, no prefill graphs, no FP8, no FlashInfer.
    deterministic: bool = False

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "page_size", "stream_interval", *CASCADE_SIZES, *GRAMMAR_SIZES):
            check_int(f"EngineConfig.{name}", getattr(self, name))
        for name in ("chunked_prefill_size", "mixed_prefill_tokens", "prompt_logprob_rows", *KV_SIZES):
            check_int(f"EngineConfig.{name}", getattr(self, name), optional=True)
        check_int("EngineConfig.extend_graph_tokens", self.extend_graph_tokens, minimum=0)
        ms, wd = self.stream_interval_ms, self.watchdog_timeout_s
        check_number("EngineConfig.stream_interval_ms", ms, 0, 1e12, "a number of milliseconds >= 0")
        if wd is not None:
            check_number("EngineConfig.watchdog_timeout_s", wd, 0, 1e9, "None or seconds > 0", low_open=True)
        timeout, seconds = self.grammar_compile_timeout, "a number of seconds > 0"
        check_number("EngineConfig.grammar_compile_timeout", timeout, 0, math.inf, seconds, low_open=True)
        check_number("EngineConfig.mem_fraction", self.mem_fraction, 0.0, 1.0, "in (0, 1]", low_open=True)
        # The scheduler multiplies every admission by it: a NaN or a string there would fail the
        # worker at the first request instead of the caller here.
        r = self.decode_reserve_ratio
        check_number("EngineConfig.decode_reserve_ratio", r, 0.0, 1.0, "a number in [0, 1]")
        check_choice("EngineConfig.dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        check_choice("EngineConfig.quantization", self.quantization, QUANTIZATIONS)
        check_choice("EngineConfig.kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("EngineConfig.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check_choice("EngineConfig.decode_kernel", self.decode_kernel, ("auto", "triton", "flashinfer"))
        check_choice("EngineConfig.layer_kernels", self.layer_kernels, ("auto", "flashinfer", "torch"))
        check_choice("EngineConfig.cascade_attention", self.cascade_attention, (None, True, False))
        devices = checked_replicas(self.data_parallel_size, self.data_parallel_devices)
        object.__setattr__(self, "data_parallel_devices", devices)  # a list given: frozen as a tuple
        if not isinstance(self.router, RouterConfig):
            raise TypeError(f"EngineConfig.router must be a RouterConfig, got {type(self.router).__name__}")
        check_deterministic(
            self.deterministic,
            self.quantization,
            self.kv_cache_dtype,
            self.attention_backend,
            self.cascade_attention,
        )

    @property
    def replicated(self) -> bool:
        """Whether this config runs replicas behind a router (`radixserve.replicas`)."""
        return self.data_parallel_size is not None or self.data_parallel_devices is not None

    @property
    def overlap_enabled(self) -> bool:
        return self.overlap and os.environ.get("RADIXSERVE_DISABLE_OVERLAP", "0") not in ("1", "true", "True")

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"EngineConfig.device={self.device!r}: {e}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"EngineConfig.device={self.device!r}: {why}; use device='cpu' or 'auto'")
        return device

    @property
    def prefill_chunk(self) -> int:
        """`chunked_prefill_size`, or the default of the device."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        return GPU_CHUNK if self.torch_device().type == "cuda" else CPU_CHUNK

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    def scheduler_config(self, vocab_size: int) -> SchedulerConfig:
        """The scheduler's part, for a model of `vocab_size` tokens (it bounds the logits rows
        a step may score for prompt logprobs)."""
        device = self.torch_device().type
        lp_rows = self.prompt_logprob_rows or max(
            self.max_running_requests, PROMPT_LOGPROB_LOGITS // vocab_size
        )
        return SchedulerConfig(
            max_running_requests=self.max_running_requests,
            prompt_logprob_rows=lp_rows,
            chunked_prefill_size=self.prefill_chunk,
            mixed_prefill_tokens=self.mixed_prefill_tokens or self.prefill_chunk,
            enable_radix_cache=self.enable_radix_cache,
            decode_reserve_ratio=self.decode_reserve_ratio,
            # BENCHMARKS.md (structured output): on the H200 a jump's mixed decode + extend
            # step leaves the CUDA-graph decode path and costs more than the passes it saves.
            jump_forward_default=device != "cuda",
            hold_for_jumps=device == "cpu",  # launch() runs the step there: a sync costs nothing
            mixed_steps=self.mixed_steps,
            stream_interval=self.stream_interval,
            stream_gap_s=self.stream_interval_ms / 1e3,
            # None keeps the threshold: the engine's build turns grouping off where no graphs run it.
            # Deterministic: a cascade step's merge of shared-prefix and suffix partials is an
            # order of sums that depends on who shares the prefix.
            cascade_min_shared=0
            if self.cascade_attention is False or self.deterministic
            else self.cascade_min_shared,
            cascade_min_saved=self.cascade_min_saved,
        )
