"""Op families as plug-ins. A case names its family by `op: name` (entry point group `xfalign.ops`,
where the built-ins register too), `op: package.module:Family`, or `op: file.py:Family` (beside the
case). A family module imports no framework; its implementations (`Family.implementations`) do, and are
loaded only in the worker of their framework."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

from harness.case import USER_IMPL
from harness.ops.family import (
    Impl,
    Implementations,
    NotAvailable,
    OpFamily,
    code_origin,
    reference,
    variant,
)
from harness.plugins import entry_points
from harness.schema import FieldProblem

GROUP = "xfalign.ops"


def known_families() -> list[str]:
    return sorted(entry_points(GROUP))


@cache
def _file_module(path: Path):
    """A Python file loaded once per run under a name of its own (never put on sys.path)."""
    name = f"xfalign_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py path always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # classes defined there can be found by their module (pickling, inspect)
    spec.loader.exec_module(module)
    return module


def load_object(target: str, relative_to: str | Path = "") -> Any:
    """`package.module:name`, or `path/file.py:name` relative to the folder of `relative_to` (a file)."""
    where, _, attribute = target.rpartition(":")
    if where.endswith(".py"):
        module = _file_module((Path(relative_to).parent / where).resolve())
    else:
        module = importlib.import_module(where)
    return getattr(module, attribute)


@cache
def _family(op: str, case_source: str) -> OpFamily:
    if ":" in op:
        if not USER_IMPL.match(op):
            raise FieldProblem(("op",), f"{op[:80]!r}: an op family is a name, package.module:Family or path/file.py:Family")
        try:
            cls = load_object(op, case_source)
        except Exception as error:  # the family's own module runs here: any error in it is the case's problem
            raise FieldProblem(("op",), f"cannot load op family {op!r}: {type(error).__name__}: {error}") from None
    elif op in entry_points(GROUP):
        cls = entry_points(GROUP)[op].load()
    else:
        raise FieldProblem(("op",), f"unknown op family {op!r}; known: {', '.join(known_families())} "
                                    "(or package.module:Family, file.py:Family)")
    if not (isinstance(cls, type) and issubclass(cls, OpFamily)):
        raise FieldProblem(("op",), f"{op} is not an OpFamily subclass")
    return cls()


def family_for(op: str, case_source: str = "") -> OpFamily:
    """The family a case names (case_source: the case file, for `file.py:Family`)."""
    return _family(op, case_source if ":" in op else "")


def framework_impls(op: str, framework: str, case_source: str = "") -> dict[str, Impl]:
    """The family's implementations on one framework, by variant name (imports that framework)."""
    family = family_for(op, case_source)
    # "file.py:Class" is found beside the family's file; its module may have left sys.modules (a test, a
    # worker's reset of user modules) while the class lives on
    module = sys.modules.get(type(family).__module__) or importlib.import_module(type(family).__module__)
    family_file = module.__file__ or ""
    implementations = load_object(family.implementations[framework], family_file)
    if not (isinstance(implementations, type) and issubclass(implementations, Implementations)):
        raise TypeError(f"{family.implementations[framework]} is not an Implementations subclass")
    return implementations.impls()


def reference_framework(case) -> str | None:
    """The framework whose worker computes the case's float64 reference: the first of the case's sides'
    frameworks the family has a reference for, else the family's first; None when it has none."""
    declared = family_for(case.op, case.source).reference
    return next((s.framework for s in case.sides.values() if s.framework in declared), next(iter(declared), None))


def reference_impl(op: str, framework: str, case_source: str = "") -> Impl:
    """The family's float64 reference on `framework` (imports that framework)."""
    family = family_for(op, case_source)
    module = sys.modules.get(type(family).__module__) or importlib.import_module(type(family).__module__)
    target = family.reference[framework]
    found = load_object(target, module.__file__ or "")
    if isinstance(found, Impl):
        return found
    if callable(found):
        return Impl(found, f"float64 reference {target} of op family {family.name}")
    raise TypeError(f"{target} (the float64 reference of op family {family.name}) is not a function")


__all__ = ["Impl", "Implementations", "NotAvailable", "OpFamily", "code_origin", "family_for", "framework_impls",
           "known_families", "load_object", "reference", "reference_framework", "reference_impl", "variant"]
