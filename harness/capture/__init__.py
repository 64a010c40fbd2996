"""Capture inside real models: every selected module's inputs, outputs, gradients and parameters, per
step, as a tree of xfalign dumps (harness.store.tree_format), compared across frameworks through a map."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # lazy: importing one submodule (capture.mapping, capture.replay) does not load the capture API
    if name in ("capture", "Capture", "CaptureError", "CaptureWriteError"):
        from harness.capture import api

        return getattr(api, name)
    if name in ("read_tree", "Tree", "TreeError"):
        from harness.store import tree

        return getattr(tree, name)
    raise AttributeError(name)
