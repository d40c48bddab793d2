"""Import a file of ``scripts/`` as a module (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def script_module(name: str) -> Iterator[object]:
    """``scripts/<name>.py`` loaded as module ``name`` for the duration of the block, with
    ``scripts/`` on ``sys.path`` as when Python runs a script (scripts import ``bench_util``)."""
    folder = str(ROOT / "scripts")
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        if added:
            sys.path.remove(folder)
