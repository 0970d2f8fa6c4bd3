"""The on-disk cache of converted models: where it lives and how a folder appears in it atomically."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "RADIXSERVE_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/radixserve"


def cache_root() -> Path:
    """`$RADIXSERVE_CACHE_DIR`, else `~/.cache/radixserve`."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """Return `final`, first building it with `build(tmp_dir)` if it does not exist.

    The folder is written under a temporary name next to `final` and renamed
    into place, so `final` either does not exist or is complete: a crash leaves
    only a stray temp folder, and of two concurrent first builds one wins the
    rename and the other discards its copy.
    """
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
