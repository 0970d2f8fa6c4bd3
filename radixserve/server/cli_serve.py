"""`radixserve serve`: the HTTP server on one engine (OpenAI-compatible and SGLang-native routes).

    radixserve serve --model smollm2-135m-instruct --host 127.0.0.1 --port 8000 --api-key KEY
    radixserve serve --model /models/llama-3.1-8b --data-parallel-size 8   # a replica per GPU
    radixserve serve --model /models/llama-3.1-8b --ray --replicas 8       # on Ray Serve

Loopback by default; binding another address without an API key prints a
warning. Only the Host names in --allowed-hosts are served (default: localhost,
127.0.0.1, [::1] and the bound address), POST bodies must be JSON, and browsers
on other sites get no access unless --cors-origins names them. An empty
--api-key (or an empty $RADIXSERVE_API_KEY) is refused at start-up.

Ctrl-C or SIGTERM stops accepting connections, lets in-flight responses finish
for up to --graceful-timeout seconds, cancels (aborts) what is left, then stops
the engine; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.server.limits import ServerLimits


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model over HTTP (OpenAI-compatible and SGLang-native)")
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="embedded name, HF folder, .gguf file or dummy:<shape>",
    )
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--quantization", default=None, choices=["fp8"], help="fp8: FP8 weights, quantized at load"
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "fp8_e4m3"],
        help="fp8_e4m3: an FP8 KV cache, twice the tokens in the same memory (auto: the model dtype)",
    )
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=None,
        metavar="N",
        help="N replicas of the model, one per GPU (cuda:0..N-1; N on the CPU), behind a "
        "cache-aware router (docs/replicas.md)",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="serve on Ray Serve (the ray extra): --replicas engines behind a prefix-affinity router",
    )
    p.add_argument("--replicas", type=int, default=1, metavar="N", help="with --ray: engine replicas")
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --ray: a Ray cluster to join (default: $RAY_ADDRESS, else a local Ray)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("RADIXSERVE_API_KEY"),
        help="require `Authorization: Bearer KEY` (default: $RADIXSERVE_API_KEY, else none; "
        "an empty key is an error)",
    )
    p.add_argument(
        "--allowed-hosts",
        nargs="+",
        default=None,
        metavar="HOST",
        help="Host header values served, '*' for any, '*.example.com' for a domain "
        "(default: localhost 127.0.0.1 [::1] and the --host address)",
    )
    p.add_argument(
        "--cors-origins",
        nargs="+",
        default=(),
        metavar="ORIGIN",
        help="browser origins allowed to call the server, e.g. https://app.example.com, '*' for any "
        "(default: none)",
    )
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--max-queued-requests", type=int, default=1024, help="in-flight completions before 503")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt (default: context)")
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=1 << 20,
        help="longest prompt text in characters, checked before tokenizing (default 1 Mi)",
    )
    p.add_argument(
        "--max-json-depth",
        type=int,
        default=128,
        help="deepest nesting of objects and arrays in a request body (default 128, at most 200)",
    )
    p.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=5,
        help="seconds an idle keep-alive connection stays open (default 5)",
    )
    p.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds to finish in-flight work on stop"
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def check_serve_args(args: argparse.Namespace) -> ServerLimits:
    """The server's limits from the command line; ValueError names a bad argument (the CLI's
    exit code 2)."""
    from radixserve.server.limits import ServerLimits

    limits = ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_queued_requests=args.max_queued_requests,
        max_prompt_chars=args.max_prompt_chars,
        max_json_depth=args.max_json_depth,
    )
    if args.data_parallel_size is not None and args.data_parallel_size < 1:
        raise ValueError(f"--data-parallel-size {args.data_parallel_size}: must be >= 1")
    if args.replicas < 1:
        raise ValueError(f"--replicas {args.replicas}: must be >= 1")
    if args.ray and args.data_parallel_size is not None:
        raise ValueError("--ray runs --replicas engines: leave --data-parallel-size out")
    if (args.replicas != 1 or args.ray_address) and not args.ray:
        raise ValueError("--replicas and --ray-address go with --ray")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be in [0, 65535]")
    if args.timeout_keep_alive < 1:
        raise ValueError(f"--timeout-keep-alive {args.timeout_keep_alive}: must be >= 1")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError(
            "the API key is empty (--api-key or $RADIXSERVE_API_KEY): give a non-empty key, "
            "or unset it to serve without one"
        )
    from radixserve.server.app import ServerSettings

    hosts = tuple(args.allowed_hosts or ("*",))
    ServerSettings("", args.api_key, limits, hosts, tuple(args.cors_origins))  # validates the hosts
    return limits


def serve_command(args: argparse.Namespace, limits: ServerLimits) -> None:
    """Warn about an open address, then serve until stopped; errors propagate to the CLI,
    which turns them into one line and exit code 1. (`--ray` is the CLI's: radixserve.ray.)"""
    warn_open_address(args)
    from radixserve.config import EngineConfig
    from radixserve.engine import AsyncEngine
    from radixserve.event_loops import run
    from radixserve.server.runner import serve

    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        data_parallel_size=args.data_parallel_size,
    )
    engine = AsyncEngine(config)

    def ready(server: Any, url: str) -> None:
        print(
            f"radixserve: serving {args.served_model_name or args.model} on {url} (OpenAI API at {url}/v1)",
            file=sys.stderr,
            flush=True,
        )

    run(
        serve(
            engine,
            args.host,
            args.port,
            api_key=args.api_key,
            limits=limits,
            model_name=args.served_model_name,
            allowed_hosts=args.allowed_hosts,
            cors_origins=args.cors_origins,
            keep_alive_s=args.timeout_keep_alive,
            graceful_s=args.graceful_timeout,
            log_level=args.log_level,
            on_ready=ready,
        )
    )
    print("radixserve: stopped", file=sys.stderr)


def warn_open_address(args: argparse.Namespace) -> None:
    """To stderr: an address others can reach without a key, or a wildcard that answers only
    loopback names."""
    if not args.api_key and not _is_loopback(args.host):
        print(
            f"radixserve: warning: serving on {args.host} without --api-key: "
            "anyone who can reach it may use it",
            file=sys.stderr,
        )
    if args.allowed_hosts is None and _is_wildcard(args.host):
        print(
            f"radixserve: note: serving on {args.host}: only requests to localhost, 127.0.0.1 or "
            "[::1] are answered; name the hosts clients (and health probes) use with --allowed-hosts",
            file=sys.stderr,
        )


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
