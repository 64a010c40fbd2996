"""Capture inside real models: every selected module's inputs, outputs, gradients and parameters, per
step, as a tree of xfalign dumps (harness.capture.format), compared across frameworks through a map."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # lazy: harness.dump imports harness.capture.format, and the API imports harness.dump
    if name in ("capture", "Capture", "CaptureError", "CaptureWriteError"):
        from harness.capture import api

        return getattr(api, name)
    if name in ("read_tree", "Tree", "TreeError"):
        from harness.capture import tree

        return getattr(tree, name)
    raise AttributeError(name)
