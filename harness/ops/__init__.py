"""Op families. Each lives in one subpackage: its case rules and signature here (no framework
imports), its Megatron reference in `megatron.py`, its Paddle variants in `paddle.py`."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from harness.case import FieldProblem

FAMILIES = ("swiglu", "moe_combine", "linear")


class NotAvailable(Exception):
    """An implementation that cannot run here (e.g. a GPU-only kernel on CPU): a result, not a crash."""


@lru_cache(maxsize=None)
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def code_origin(obj: Any) -> str | None:
    """"<distribution> <version>, <file>" for the installed file that defines obj; None when it belongs to
    no installed distribution (a user's file) or has no Python source."""
    try:
        path = inspect.getsourcefile(obj) or inspect.getfile(obj)
    except TypeError:  # built-in or C code
        return None
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    distributions = _distributions().get((module or "").partition(".")[0])
    if not path or not distributions:
        return None
    try:
        version = importlib.metadata.version(distributions[0])
    except importlib.metadata.PackageNotFoundError:
        return None
    return f"{distributions[0]} {version}, {path}"


_DOTTED = re.compile(r"(?<![\w./-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def _named_objects(text: str) -> list[Any]:
    """Objects a provenance text names by dotted path (e.g. megatron.core.fusions.fused_bias_swiglu.bias_swiglu_impl),
    resolved among modules already imported (nothing is imported here)."""
    found = []
    for name in _DOTTED.findall(text):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            module = sys.modules.get(".".join(parts[:cut]))
            if module is None:
                continue
            obj = module
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute, None)
            if obj is not None:
                found.append(obj)
            break
    return found


@dataclass(frozen=True)
class Impl:
    """One implementation of an op on one framework, with where its code comes from."""

    fn: Callable[..., Any]
    provenance: str | Callable[[dict], str]  # a text, or one made from the case's options
    # options -> the object (function, class, module) whose code does the work, where fn wraps it; by
    # default the objects the provenance names by dotted path
    source: Callable[[dict], Any] | None = None

    def provenance_for(self, options: dict) -> str:
        """The provenance text, then the installed file and distribution version of the code it names and of
        fn, e.g. "...; megatron-core 0.16.1, /.../megatron/core/fusions/fused_bias_swiglu.py; xfalign 0.1.0, ..."."""
        text = self.provenance(options) if callable(self.provenance) else self.provenance
        named = [self.source(options)] if self.source is not None else _named_objects(text)
        origins = []
        for obj in [*named, self.fn]:
            origin = code_origin(obj)
            if origin and origin not in origins:
                origins.append(origin)
        return "; ".join([text, *origins])


def family_for(op: str):
    if op not in FAMILIES:
        raise FieldProblem(("op",), f"unknown op family {op!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"harness.ops.{op}").FAMILY


def framework_impls(op: str, framework: str) -> dict[str, Impl]:
    """Built-in implementations of an op for a framework (imports that framework)."""
    return importlib.import_module(f"harness.ops.{op}.{framework}").IMPLS
