"""Plug-ins by entry point group (`xfalign.frameworks`, `xfalign.ops`): built-ins register the same way."""

from __future__ import annotations

import importlib.metadata
from functools import cache


@cache
def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points by name, read once per process."""
    return {point.name: point for point in importlib.metadata.entry_points(group=group)}
