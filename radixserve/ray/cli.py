"""`radixserve serve --ray --replicas N`: the app of `build_app` on Ray Serve, until Ctrl-C.

Without `--ray-address` (or `$RAY_ADDRESS`) it starts a local Ray; with one it
joins that cluster (`ray start --head` on one machine, `ray start --address=...`
on the others: README, "Replicas"). Ray Serve's HTTP proxy listens on
`--host`/`--port`; Ctrl-C or SIGTERM deletes the application and stops Serve
(and the local Ray it started).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from types import FrameType

from radixserve.config import EngineConfig
from radixserve.server.limits import ServerLimits

APP_NAME = "radixserve"


def serve_on_ray(args: argparse.Namespace, limits: ServerLimits) -> None:
    """Run until a signal, then say "stopped"; raises what stops it from starting."""
    import ray
    from ray import serve

    from radixserve.ray.app import build_app
    from radixserve.server.cli_serve import warn_open_address
    from radixserve.server.runner import default_allowed_hosts

    warn_open_address(args)
    port = args.port or _free_port(args.host)
    hosts = tuple(args.allowed_hosts) if args.allowed_hosts else default_allowed_hosts(args.host)
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype)
    app = build_app(
        config,
        args.replicas,
        api_key=args.api_key,
        model_name=args.served_model_name,
        allowed_hosts=hosts,
        cors_origins=tuple(args.cors_origins),
        limits=limits,
    )
    local = not (args.ray_address or os.environ.get("RAY_ADDRESS"))
    ray.init(address=args.ray_address, include_dashboard=False)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": args.host, "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        url = f"http://{args.host}:{port}"
        print(
            f"radixserve: serving {args.served_model_name or args.model} on {url} (OpenAI API at "
            f"{url}/v1) with {args.replicas} replica(s) on Ray",
            file=sys.stderr,
            flush=True,
        )
        stop.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if local:  # the Ray we started goes, Serve with it
            serve.shutdown()
        else:  # a cluster's Serve may run other applications
            serve.delete(APP_NAME)
        ray.shutdown()
    print("radixserve: stopped", file=sys.stderr)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
