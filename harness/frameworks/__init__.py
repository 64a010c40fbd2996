"""Framework adapters, registered under the entry point group `xfalign.frameworks` (built-ins included):
the only code that imports a framework, and only inside its methods."""

from __future__ import annotations

import importlib.metadata
from functools import cache

from harness.frameworks.base import FrameworkAdapter

GROUP = "xfalign.frameworks"


@cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {point.name: point for point in importlib.metadata.entry_points(group=GROUP)}


def known_frameworks() -> list[str]:
    return sorted(_entry_points())


@cache
def adapter_for(name: str) -> FrameworkAdapter:
    point = _entry_points().get(name)
    if point is None:
        raise KeyError(f"unknown framework {name!r}; known: {', '.join(known_frameworks())}")
    adapter = point.load()()
    adapter.name = name
    return adapter


__all__ = ["FrameworkAdapter", "adapter_for", "known_frameworks"]
