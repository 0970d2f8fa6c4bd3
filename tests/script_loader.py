"""Import a script that is not in a package (an example, a benchmark) the way tests need it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"


def load_script(path: Path, name: str) -> ModuleType:
    """`path` imported as module `name`, registered in sys.modules before it runs: pydantic
    and dataclasses look a class's module up there."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_example(name: str) -> ModuleType:
    """examples/`name`.py as module `example_<name>`."""
    return load_script(EXAMPLES / f"{name}.py", f"example_{name}")
