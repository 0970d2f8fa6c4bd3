"""Records of the GPU suite: one JSON object per figure, appended as they are measured.

Each record carries the run's provenance (commit and dirty flag taken by the
script itself, see `common.provenance`), the date, device, dtype and
versions, so that a line of `h200.jsonl` stands on its own. The printed table
comes last, after every section.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import _version, environment, format_table


class Recorder:
    def __init__(
        self,
        out_files: list[Path],
        device: str,
        dtype: str,
        quick: bool,
        quantization: str | None = None,
        deterministic: bool = False,
    ) -> None:
        env = environment()  # taken once, when the run starts
        prov = env["provenance"]
        self.head: dict[str, Any] = {
            "commit": prov["commit"],
            "dirty": prov["dirty"],
            "commit_source": prov["commit_source"],
            "source_sha256": prov["source_sha256"],
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "dtype": dtype,
            "versions": env["versions"]
            | {
                "cuda": torch.version.cuda,
                "triton": _version("triton"),
                "flashinfer": _version("flashinfer-python"),
            },
            "quick": quick,
        }
        # A quantized run's records say so in their setting too ("1000/1000 fp8"), so tables and
        # comparisons of settings cannot mix them up with the model dtype's.
        self.setting_suffix = ""
        if quantization is not None:
            self.head["quantization"] = quantization
            self.setting_suffix = quantization
        if deterministic:  # likewise: "1000/1000 deterministic" (or "... fp8 deterministic")
            self.head["deterministic"] = True
            self.setting_suffix = f"{self.setting_suffix} deterministic".strip()
        if "env_commit" in prov:  # a copied tree's stale .git: what the caller says ran
            self.head["env_commit"] = prov["env_commit"]
        # Appended to, never truncated: several runs into one folder (a device call's sections one
        # after another) keep every record, each with its own time and command.
        self.out_files = out_files
        for f in out_files:
            f.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict[str, Any]] = []
        self.rows: list[tuple[str, str, str, str, str]] = []

    def __call__(
        self, workload: str, model: str, setting: str, metric: str, value: float, **extra: Any
    ) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        setting = f"{setting} {self.setting_suffix}".strip()
        rec: dict[str, Any] = {
            "date": now.strftime("%Y-%m-%d"),
            "time": now.isoformat(timespec="seconds"),
            **self.head,
            "workload": workload,
            "model": model,
            "setting": setting,
            "metric": metric,
            "value": round(float(value), 4),
        }
        extra = {k: v for k, v in extra.items() if v is not None}
        rec.update(extra)
        self.records.append(rec)
        line = json.dumps(rec, default=str) + "\n"
        for f in self.out_files:  # written as we go: a run cut short keeps what it measured
            with open(f, "a") as fh:
                fh.write(line)
        note = " ".join(f"{k}={_short(v)}" for k, v in extra.items())
        self.rows.append((workload, model, setting, metric, f"{_figure(value)} {note}".strip()))
        print(f"[{workload}] {model} {setting} {metric} = {_figure(value)} {note}", flush=True)

    def failed(self, section: str, error: BaseException) -> None:
        self.rows.append((section, "-", "-", "FAILED", repr(error)[:120]))

    def table(self) -> str:
        return format_table(["workload", "model", "setting", "metric", "value"], self.rows)


def _figure(v: float) -> str:
    """A measured value for the eye: whole units from a thousand up ("21,146", not "2.115e+04")."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.4g}"


def _short(v: Any) -> str:
    if isinstance(v, float):
        return _figure(v)
    if isinstance(v, (list, dict)):
        s = json.dumps(v)
        return s if len(s) <= 60 else s[:57] + "..."
    return str(v)
