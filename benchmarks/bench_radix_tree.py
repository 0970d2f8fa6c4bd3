"""Radix tree micro-benchmark on the CPU: match, insert and evict against trees of 10k–1M tokens.

The tree is filled the way a serving workload fills it: a few hundred shared
system prompts, multi-turn conversations that extend earlier ones, and fresh
one-off prompts, until it holds the target number of tokens in the target
number of sequences (1M tokens in 10k sequences for the headline figures).
The prompt being matched is a cached conversation of 8 turns, each turn an
edge with a sibling branch, so a match walks ~9 nodes as it would in a chat.

  python benchmarks/bench_radix_tree.py [--out benchmarks/results/radix_tree_cpu.json]

Figures: median wall time of `match_prefix` on a fully cached prompt (the key
passed as a Python list, as the scheduler will), `insert` of a new prompt
whose first quarter is cached, and `evict` of 100k tokens from the 1M tree.
Insert runs with every other leaf locked so that `evict` can remove the
inserted prompt again and the tree keeps its size between runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from radixserve.cache import RadixCache, SlotAllocator, TreeNode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import cpu_model, git_commit  # noqa: E402

VOCAB = 128_000
TURNS = 8


@dataclass(frozen=True)
class ScalingRow:
    tree_tokens: int
    tree_sequences: int
    tree_nodes: int
    prompt_len: int
    match_us: float  # median, fully cached prompt
    match_depth: int  # nodes on the matched path
    insert_us: float  # median, new prompt with its first quarter cached


@dataclass(frozen=True)
class EvictResult:
    tree_tokens: int
    evict_tokens: int
    evict_ms: float  # median over successive evictions from the same tree
    evict_min_ms: float
    freed_tokens: int  # per call (whole leaves, so a little more than asked)


class TreeBuilder:
    """Fills a RadixCache with a realistic mix of shared and fresh prefixes."""

    def __init__(self, cache: RadixCache, allocator: SlotAllocator, seed: int) -> None:
        self.cache = cache
        self.allocator = allocator
        self.rng = np.random.default_rng(seed)
        self.sequences = 0
        self.system_prompts = [self.tokens(int(self.rng.integers(32, 512))) for _ in range(200)]
        self.history: list[list[int]] = []

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(0, VOCAB, size=n).tolist()

    def put(self, key: list[int]) -> int:
        """Insert by the caller protocol (no lock held: a request with no match)."""
        slots = self.allocator.alloc(len(key))
        if slots is None:
            raise RuntimeError("benchmark allocator too small")
        cached = self.cache.insert(key, slots)
        self.allocator.free(slots[:cached])
        self.sequences += 1
        return cached

    def conversation(self, length: int) -> list[int]:
        """A cached chat of `length` tokens in TURNS turns, each turn with an alternative branch."""
        system = self.system_prompts[int(self.rng.integers(len(self.system_prompts)))]
        convo = system[: length // TURNS] + self.tokens(length - min(len(system), length // TURNS))
        bounds = np.linspace(0, length, TURNS + 1).astype(int)[1:]
        for end in bounds:
            self.put(convo[:end])
            self.put(convo[: max(1, end - length // (2 * TURNS))] + self.tokens(16))  # a sibling branch
        return convo

    def fill(self, target_tokens: int, target_sequences: int) -> None:
        while self.sequences < target_sequences - 1 and self.cache.total_size < target_tokens:
            left = target_sequences - self.sequences
            mean = max(1.0, (target_tokens - self.cache.total_size) / left)
            fresh = int(
                min(max(1, self.rng.exponential(mean)), 8 * mean, target_tokens - self.cache.total_size)
            )
            r = self.rng.random()
            if r < 0.3 and self.history:  # a later turn of an earlier conversation
                base = self.history[int(self.rng.integers(len(self.history)))]
            elif r < 0.85:  # a new conversation under a shared system prompt
                base = self.system_prompts[int(self.rng.integers(len(self.system_prompts)))]
            else:
                base = []
            key = base + self.tokens(fresh)
            self.put(key)
            if len(key) < 8192:
                self.history.append(key)
        if self.cache.total_size < target_tokens:  # top up to the exact size with one last sequence
            self.put(self.tokens(target_tokens - self.cache.total_size))


def median_us(fn, runs: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def leaves(cache: RadixCache) -> list[TreeNode]:
    out, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        if node.children:
            stack.extend(node.children.values())
        else:
            out.append(node)
    return out


def measure(
    tree_tokens: int, prompt_lens: list[int], seed: int, runs: int
) -> tuple[list[ScalingRow], RadixCache, SlotAllocator, TreeBuilder]:
    allocator = SlotAllocator(tree_tokens + 16 * max(prompt_lens) + 100_000)
    cache = RadixCache(allocator)
    builder = TreeBuilder(cache, allocator, seed)
    prompts = {p: builder.conversation(p) for p in prompt_lens}
    builder.fill(tree_tokens, max(1, tree_tokens // 100))
    gc.collect()

    rows = []
    locked = leaves(cache)
    for p, prompt in prompts.items():
        m = cache.match_prefix(prompt)
        assert m.length == p, f"prompt of {p} tokens not fully cached ({m.length})"
        depth, node = 0, m.last_node
        while node.parent is not None:  # up to the root
            depth, node = depth + 1, node.parent
        match = median_us(lambda prompt=prompt: cache.match_prefix(prompt), runs)

        # insert: a new prompt sharing its first quarter with a cached one
        for leaf in locked:
            cache.lock(leaf)
        times = []
        for _ in range(runs + 5):
            new = prompt[: p // 4] + builder.tokens(p - p // 4)
            slots = allocator.alloc(p)
            assert slots is not None
            size = cache.total_size
            t0 = time.perf_counter_ns()
            cached = cache.insert(new, slots)
            times.append(time.perf_counter_ns() - t0)
            allocator.free(slots[:cached])
            assert cache.evict(p) == p - cached and cache.total_size == size  # only the new leaf
        for leaf in locked:
            cache.unlock(leaf)
        rows.append(
            ScalingRow(
                tree_tokens=cache.total_size,
                tree_sequences=builder.sequences,
                tree_nodes=cache.num_nodes,
                prompt_len=p,
                match_us=match,
                match_depth=depth,
                insert_us=statistics.median(times[5:]) / 1e3,
            )
        )
    cache.check_integrity()
    return rows, cache, allocator, builder


def measure_evict(cache: RadixCache, n_tokens: int, repeats: int) -> EvictResult:
    size = cache.total_size
    times, freed = [], 0
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter_ns()
        freed += cache.evict(n_tokens)
        times.append(time.perf_counter_ns() - t0)
    cache.check_integrity()
    return EvictResult(size, n_tokens, statistics.median(times) / 1e6, min(times) / 1e6, freed // repeats)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/radix_tree_cpu.json"))
    parser.add_argument("--tree-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per match figure")
    parser.add_argument("--evict-tokens", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; the tree's tensor ops are small, and on a busy CPU waking "
        "OpenMP workers for a 100k-element copy costs more than the copy",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows: list[ScalingRow] = []
    evict: EvictResult | None = None
    for size in sorted(args.tree_sizes):
        t0 = time.perf_counter()
        size_rows, cache, _, builder = measure(size, args.prompt_lens, args.seed, args.runs)
        rows += size_rows
        print(
            f"tree of {cache.total_size} tokens, {builder.sequences} sequences, {cache.num_nodes} nodes "
            f"built and measured in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        if size == max(args.tree_sizes):
            evict = measure_evict(cache, args.evict_tokens, repeats=7)

    print(
        f"\n{'tree tokens':>12} {'sequences':>9} {'nodes':>7} {'prompt':>6} {'depth':>5} "
        f"{'match us':>9} {'insert us':>9}"
    )
    for r in rows:
        print(
            f"{r.tree_tokens:>12,} {r.tree_sequences:>9,} {r.tree_nodes:>7,} {r.prompt_len:>6} "
            f"{r.match_depth:>5} {r.match_us:>9.1f} {r.insert_us:>9.1f}"
        )
    if evict is not None:
        print(
            f"\nevict {evict.evict_tokens:,} tokens from a {evict.tree_tokens:,}-token tree: "
            f"{evict.evict_ms:.2f} ms median, {evict.evict_min_ms:.2f} ms min "
            f"(7 successive calls, {evict.freed_tokens:,} freed each)"
        )
    headline = max(
        (r for r in rows if r.prompt_len == max(args.prompt_lens)), key=lambda r: r.tree_tokens, default=None
    )
    if headline is not None:
        verdict = "meets" if headline.match_us < 1000 else "MISSES"
        print(
            f"fully cached {headline.prompt_len}-token match on {headline.tree_tokens:,} tokens: "
            f"{headline.match_us:.1f} us ({verdict} the 1 ms target)"
        )

    result = {
        "benchmark": "radix_tree_cpu",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit() or "unknown",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_model() or platform.processor() or platform.machine(),
        "runs": args.runs,
        "torch_threads": args.threads,
        "scaling": [asdict(r) for r in rows],
        "evict": asdict(evict) if evict is not None else None,
        "headline_match_us": headline.match_us if headline is not None else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
