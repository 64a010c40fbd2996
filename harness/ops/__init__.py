"""Op families. Each lives in one subpackage: its case rules and signature here (no framework
imports), its Megatron reference in `megatron.py`, its Paddle variants in `paddle.py`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from harness.case import FieldProblem

FAMILIES = ("swiglu", "moe_combine", "linear")


class NotAvailable(Exception):
    """An implementation that cannot run here (e.g. a GPU-only kernel on CPU): a result, not a crash."""


@dataclass(frozen=True)
class Impl:
    """One implementation of an op on one framework, with where its code comes from."""

    fn: Callable[..., Any]
    provenance: str | Callable[[dict], str]  # a text, or one made from the case's options

    def provenance_for(self, options: dict) -> str:
        return self.provenance(options) if callable(self.provenance) else self.provenance


def family_for(op: str):
    if op not in FAMILIES:
        raise FieldProblem(("op",), f"unknown op family {op!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"harness.ops.{op}").FAMILY


def framework_impls(op: str, framework: str) -> dict[str, Impl]:
    """Built-in implementations of an op for a framework (imports that framework)."""
    return importlib.import_module(f"harness.ops.{op}.{framework}").IMPLS
