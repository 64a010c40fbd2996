"""Plug-ins by entry point group (`xfalign.frameworks`, `xfalign.ops`): built-ins register the same way."""

from __future__ import annotations

import importlib.metadata
import tomllib
from functools import cache
from pathlib import Path


@cache
def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points by name, read once per process. Where xfalign itself is not installed (a source
    checkout on PYTHONPATH, as on a machine where nothing may be installed), its built-ins are read from the
    pyproject.toml beside the package, which declares them."""
    found = {point.name: point for point in importlib.metadata.entry_points(group=group)}
    if not _installed():
        for name, value in _source_entry_points().get(group, {}).items():
            found.setdefault(name, importlib.metadata.EntryPoint(name, value, group))
    return found


def _installed() -> bool:
    try:
        importlib.metadata.distribution("xfalign")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _source_entry_points() -> dict[str, dict[str, str]]:
    """pyproject.toml's `project.entry-points` of the checkout this package was imported from ({} if none)."""
    try:
        data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    project = data.get("project", {})
    return project.get("entry-points", {}) if project.get("name") == "xfalign" else {}
