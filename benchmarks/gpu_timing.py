"""Timing one GPU call the way a decode step runs it: replayed from a CUDA graph, no launch gaps."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def graph_ms(fn: Callable[[], object], iters: int, calls: int = 10) -> float:
    """Median milliseconds of one call of `fn`, over `iters` replays of a CUDA graph holding
    `calls` calls (CUDA events around each replay)."""
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)
