"""`radixserve serve`: the HTTP server on one engine (OpenAI-compatible and SGLang-native routes).

    radixserve serve --model smollm2-135m-instruct --host 127.0.0.1 --port 8000 --api-key KEY

Loopback by default; binding another address without an API key prints a
warning. Ctrl-C or SIGTERM stops accepting connections, lets in-flight
responses finish for up to --graceful-timeout seconds, cancels (aborts) what is
left, then stops the engine; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model over HTTP (OpenAI-compatible and SGLang-native)")
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="embedded name, HF folder, .gguf file or dummy:<shape>",
    )
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("RADIXSERVE_API_KEY"),
        help="require `Authorization: Bearer KEY` (default: $RADIXSERVE_API_KEY, else none)",
    )
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--max-queued-requests", type=int, default=1024, help="in-flight completions before 503")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt (default: context)")
    p.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds to finish in-flight work on stop"
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def serve_command(args: argparse.Namespace) -> int:
    from radixserve.cli import EXIT_RUNTIME, EXIT_USAGE, _fail, _one_line

    try:
        from radixserve.server.limits import ServerLimits

        limits = ServerLimits(args.max_body_bytes, args.max_prompt_tokens, args.max_queued_requests)
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port {args.port}: must be in [0, 65535]")
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    if not args.api_key and not _is_loopback(args.host):
        print(
            f"radixserve: warning: serving on {args.host} without --api-key: "
            "anyone who can reach it may use it",
            file=sys.stderr,
        )
    try:
        from radixserve.config import EngineConfig
        from radixserve.engine import AsyncEngine
        from radixserve.server.runner import run, serve

        engine = AsyncEngine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype))

        def ready(server: Any, url: str) -> None:
            print(
                f"radixserve: serving {args.served_model_name or args.model} on {url} "
                f"(OpenAI API at {url}/v1)",
                file=sys.stderr,
                flush=True,
            )

        run(
            serve(
                engine,
                args.host,
                args.port,
                api_key=args.api_key or None,
                limits=limits,
                model_name=args.served_model_name,
                graceful_s=args.graceful_timeout,
                log_level=args.log_level,
                on_ready=ready,
            )
        )
    except KeyboardInterrupt:  # during start-up, before the server's own handlers
        return 130
    except Exception as e:
        if os.environ.get("RADIXSERVE_DEBUG"):
            raise
        return _fail(_one_line(e), EXIT_RUNTIME)
    print("radixserve: stopped", file=sys.stderr)
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
