"""Shared pieces of the benchmark scripts: workloads, result records, tables.

Workloads follow the definitions in BENCHMARKS.md exactly, so that figures from
different machines can be set side by side. Nothing here imports torch or
radixserve at module level: a GPU suite can reuse the generators and writers
as they are.

Draw order (one `random.Random(seed)` stream, the same stream as
`random.seed(seed)` followed by the module-level functions):

- W1: first the lengths of every request, in order, each as
  `input_len = randint(lo, hi)` then `output_len = randint(lo, hi)`; then the
  input ids of request 0, 1, ..., each `randint(0, vocab_size - 1)`. Drawing
  all lengths first makes them the same for every vocabulary size.
- W2: the prefix ids first, then each request's question ids in order, each
  `randint(0, vocab_size - 1)`.
- W8: the prefix ids of every group, group by group, then each request's own
  ids in arrival order (one request of each group in turn).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Request = tuple[list[int], int]  # (input ids, output length)

ROOT = Path(__file__).resolve().parent.parent


# ---- workloads ------------------------------------------------------------------------------


def w1_requests(n: int, lo: int, hi: int, vocab_size: int, seed: int = 0) -> list[Request]:
    """W1 offline throughput: n requests, input/output lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    lengths = [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]
    return [([rng.randint(0, vocab_size - 1) for _ in range(i)], o) for i, o in lengths]


@dataclass(frozen=True)
class W2Shape:
    """W2 shared prefix: `n` requests of `prefix_len` shared + `q_len` own tokens, `out_len` generated."""

    prefix_len: int = 1024
    n: int = 512
    q_len: int = 32
    out_len: int = 32

    def scaled(self, scale: float) -> W2Shape:
        """Every dimension times `scale` (at least 1): a smaller run of the same shape."""

        def s(v: int) -> int:
            return max(1, round(v * scale))

        return W2Shape(s(self.prefix_len), s(self.n), s(self.q_len), s(self.out_len))

    def best_hit_rate(self) -> float:
        return best_hit_rate(self.n, self.prefix_len, self.q_len)


W2_FULL = W2Shape()


def w2_requests(
    prefix_len: int, n: int, q_len: int, out_len: int, vocab_size: int, seed: int = 0
) -> list[Request]:
    """W2: one shared prefix, then n requests of prefix + their own q_len tokens."""
    rng = random.Random(seed)
    prefix = [rng.randint(0, vocab_size - 1) for _ in range(prefix_len)]
    return [(prefix + [rng.randint(0, vocab_size - 1) for _ in range(q_len)], out_len) for _ in range(n)]


def w8_requests(
    groups: int, per_group: int, prefix_len: int, q_len: int, vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """W8: `groups` prefixes, each shared by `per_group` requests of prefix + q_len own ids,
    groups interleaved in arrival order."""
    rng = random.Random(seed)
    prefixes = [[rng.randint(0, vocab_size - 1) for _ in range(prefix_len)] for _ in range(groups)]
    return [
        prefixes[g] + [rng.randint(0, vocab_size - 1) for _ in range(q_len)]
        for _ in range(per_group)
        for g in range(groups)
    ]


def best_hit_rate(n: int, prefix_len: int, q_len: int) -> float:
    """The most prompt tokens a prefix cache can serve: every request but the first reuses the prefix.

    (N·P − P) / (N·(P+Q)).
    """
    return (n * prefix_len - prefix_len) / (n * (prefix_len + q_len))


# ---- environment and records ----------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


COMMIT_ENV = "RADIXSERVE_COMMIT"


def provenance(root: Path = ROOT) -> dict[str, Any]:
    """Which code ran, taken by the script itself.

    `git rev-parse HEAD` and a dirty flag (`git status --porcelain`, tracked
    files only) when `root` is a git checkout: `commit_source` is "git". On a
    copied tree without git, the commit comes from the `RADIXSERVE_COMMIT`
    environment variable if set, marked "env" (the script cannot verify it)
    with `dirty` unknown (None); else the commit is None ("unknown").
    `source_sha256` hashes the package and benchmark sources either way, so a
    copied tree can be checked against a checkout afterwards.
    """
    out: dict[str, Any] = {"commit": None, "dirty": None, "commit_source": "unknown"}
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() != root.resolve():
            raise OSError("not the top of a checkout")  # a copy inside some other repository
        head = _git(root, "rev-parse", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
        out.update(commit=head, dirty=bool(dirty), commit_source="git")
    except (OSError, subprocess.SubprocessError):
        env = os.environ.get(COMMIT_ENV, "").strip()
        if env:
            out.update(commit=env, commit_source=f"env {COMMIT_ENV} (no git here; not verified)")
    env = os.environ.get(COMMIT_ENV, "").strip()
    if env and out["commit_source"] == "git" and env != out["commit"]:
        # The device machine's copy of the tree carries a stale .git (the commit it was first
        # copied at), so its HEAD is not what ran: keep what the caller says beside it, to be
        # checked against source_sha256.
        out["env_commit"] = env
    out["source_sha256"] = source_hash(root)
    return out


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def source_hash(root: Path = ROOT) -> str:
    """sha256 over the paths and bytes of radixserve/**/*.py and benchmarks/**/*.py, sorted."""
    h = hashlib.sha256()
    for sub in ("radixserve", "benchmarks"):
        for f in sorted((root / sub).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit(root: Path = ROOT) -> str | None:
    """HEAD of the checkout, with "-dirty" when tracked files differ from it; the env fallback
    (marked "(env)") on a copied tree; None when neither is known."""
    return commit_label(provenance(root))


def commit_label(p: dict[str, Any]) -> str | None:
    """One string for a `provenance()`: "<sha>", "<sha>-dirty", "<sha> (env)" or None."""
    if p["commit"] is None:
        return None
    if p["commit_source"] != "git":
        return f"{p['commit']} (env)"
    return p["commit"] + ("-dirty" if p["dirty"] else "")


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def environment() -> dict[str, Any]:
    """Versions, commit, date and machine, for the head of a result file."""
    prov = provenance()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit_label(prov),
        "provenance": prov,
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "radixserve": _version("radixserve"),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": cpu_model() or platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average": load_average(),
        },
    }


def record(
    workload: str, model: str, dtype: str, device: str, figures: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """One benchmark result: what ran, on what, and its figures."""
    head = {"workload": workload, "model": model, "dtype": dtype, "device": device}
    return {**head, "figures": figures, **extra}


def write_results(
    path: str | Path, results: Sequence[dict[str, Any]], env: dict[str, Any] | None = None, **head: Any
) -> Path:
    """Write `{env..., **head, "results": [...]}` as indented JSON; returns the path.

    Pass the `environment()` taken when the run started: in a shared checkout
    HEAD may move while a benchmark runs.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**(env or environment()), **head, "results": list(results)}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


# ---- tables ---------------------------------------------------------------------------------


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return "" if v is None else str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (aligned in plain text too)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(list(headers)), sep, *(line(r) for r in cells)])


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], file: Any = None) -> None:
    print(format_table(headers, rows), file=file or sys.stdout, flush=True)


def print_error_rows(title: str, rows: Sequence[tuple[str, Any]], tol: float, width: int = 48) -> None:
    """A correctness table: each key's relative error (or the error that stopped it), ok below `tol`."""
    print(f"\n{title:<{width}} {'rel err':>10}  ok")
    for key, err in rows:
        ok = isinstance(err, float) and 0 <= err < tol
        shown = f"{err:.2e}" if isinstance(err, float) else str(err)[:60]
        print(f"{key:<{width}} {shown:>10}  {'yes' if ok else 'NO'}")
