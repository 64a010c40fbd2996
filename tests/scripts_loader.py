"""A script of scripts/ loaded as a module, for the tests that call its functions."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@functools.cache
def load_script(name: str) -> ModuleType:
    """scripts/<name>.py, loaded once (its imports run then), in sys.modules under its name as a script's dataclasses
    need."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
