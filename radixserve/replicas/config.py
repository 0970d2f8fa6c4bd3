"""`RouterConfig`: how requests are spread over replicas (`EngineConfig.router`).

Imports nothing heavy: `radixserve.config` reads it at import time.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("cache_aware", "round_robin", "least_loaded")


@dataclass(frozen=True)
class RouterConfig:
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
        if self.policy not in POLICIES:
            raise ValueError(f"RouterConfig.policy={self.policy!r}: use one of {', '.join(POLICIES)}")
        t = self.cache_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0:
            raise ValueError(f"RouterConfig.cache_threshold={t!r}: must be a share in [0, 1]")
        a = self.balance_abs
        if isinstance(a, bool) or not isinstance(a, int) or a < 0:
            raise ValueError(f"RouterConfig.balance_abs={a!r}: must be an integer >= 0")
        r = self.balance_rel
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 1.0 <= r < float("inf"):
            raise ValueError(f"RouterConfig.balance_rel={r!r}: must be a factor >= 1")
        n = self.index_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"RouterConfig.index_tokens={n!r}: must be None or an integer >= 1")
