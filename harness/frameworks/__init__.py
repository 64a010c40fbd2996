"""Framework adapters, registered under the entry point group `xfalign.frameworks` (built-ins included):
the only code that imports a framework, and only inside its methods."""

from __future__ import annotations

from functools import cache

from harness.frameworks.base import FrameworkAdapter
from harness.plugins import entry_points

GROUP = "xfalign.frameworks"


def known_frameworks() -> list[str]:
    return sorted(entry_points(GROUP))


@cache
def adapter_for(name: str) -> FrameworkAdapter:
    point = entry_points(GROUP).get(name)
    if point is None:
        raise KeyError(f"unknown framework {name!r}; known: {', '.join(known_frameworks())}")
    adapter = point.load()()
    adapter.name = name
    return adapter


__all__ = ["FrameworkAdapter", "adapter_for", "known_frameworks"]
