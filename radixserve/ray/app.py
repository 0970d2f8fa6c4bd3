"""`build_app`: radixserve as a Ray Serve application.

    from ray import serve
    from radixserve import EngineConfig
    from radixserve.ray import build_app

    serve.run(build_app(EngineConfig(model="/models/llama-3.1-8b"), num_replicas=4))

Two deployments: `radixserve-engine` (`num_replicas` of `EngineReplica`, one
`AsyncEngine` each, on a GPU each unless the config's device is the CPU)
behind the prefix-affinity request router (`router.py`), and `radixserve`
(one `Ingress`: the routes of `create_app`). `deployment_options` go to the
engine deployment (`ray_actor_options`, `max_ongoing_requests`, ...).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Deployment

from radixserve.config import EngineConfig
from radixserve.ray.ingress import Ingress, ServerOptions
from radixserve.ray.replica import EngineReplica
from radixserve.server.app import LOOPBACK_HOSTS
from radixserve.server.limits import ServerLimits

ENGINE_DEPLOYMENT = "radixserve-engine"
INGRESS_DEPLOYMENT = "radixserve"
ROUTER_CLASS = "radixserve.ray.router.PrefixAffinityRouter"  # imported where the handle routes


def build_app(
    config: EngineConfig,
    num_replicas: int,
    *,
    prefix_router: bool = True,
    api_key: str | None = None,
    model_name: str | None = None,
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS,
    cors_origins: tuple[str, ...] = (),
    limits: ServerLimits | None = None,
    ingress_options: dict[str, Any] | None = None,
    **deployment_options: Any,  # Ray Serve's deployment options, as Ray types them
) -> Application:
    """A Ray Serve application of `num_replicas` engines of `config` and an ingress.

    `prefix_router=False` leaves Ray Serve's default request router (power of two choices)
    in place, to compare against. `api_key` ... `limits` are `create_app`'s; the
    ingress's own Ray options go in `ingress_options`. Replicas ask for one GPU each
    (`ray_actor_options={"num_gpus": 1}`) unless `config.device` is "cpu" or the options say
    otherwise, and take up to `config.max_running_requests` requests at once."""
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas!r}: must be an integer >= 1")
    if config.replicated:
        raise ValueError("build_app makes the replicas itself: leave data_parallel_size unset in config")
    options: dict[str, Any] = {
        "num_replicas": num_replicas,
        "max_ongoing_requests": config.max_running_requests,
        "ray_actor_options": {"num_gpus": 0 if config.device == "cpu" else 1},
        **deployment_options,
    }
    if prefix_router:
        router: dict[str, Any] = {
            "request_router_class": ROUTER_CLASS,
            "request_router_kwargs": asdict(config.router),
        }
        options["request_router_config"] = RequestRouterConfig(**router)
    engines = _deployment(EngineReplica).options(name=ENGINE_DEPLOYMENT, **options).bind(config)
    server = ServerOptions(
        api_key, model_name, tuple(allowed_hosts), tuple(cors_origins), limits or ServerLimits()
    )
    ingress_cls = serve.ingress()(Ingress)
    # No CPU reserved for the ingress (as for Serve's own proxy): on a small machine every
    # core can go to a replica.
    ingress_opts = {
        "max_ongoing_requests": 1024,
        "ray_actor_options": {"num_cpus": 0},
        **(ingress_options or {}),
    }
    ingress = _deployment(ingress_cls).options(name=INGRESS_DEPLOYMENT, **ingress_opts)
    return ingress.bind(engines, config, server)


def _deployment(cls: type) -> Deployment:
    deployment = serve.deployment(cls)
    assert isinstance(deployment, Deployment)  # given a class, not the decorator's options
    return deployment
