"""What an op family is: its rules and tensor names (framework-free), and its implementations, one class
per framework whose @variant functions (staticmethods) are checked against the family's declared variants."""

from __future__ import annotations

import inspect
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from harness.case import Case
from harness.compare.expectations import sides_named
from harness.dtypes import FLOAT_DTYPES
from harness.errors import validation_problem
from harness.machine import distribution_of, version_of
from harness.schema import FieldProblem
from harness.sharding import Sharding

P = ParamSpec("P")
R = TypeVar("R")


class NotAvailable(Exception):
    """An implementation that cannot run here (e.g. a GPU-only kernel on CPU): a result, not a crash."""


class OpFamily(ABC):
    """A family of ops compared across frameworks. Subclasses set the REQUIRED class attributes."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("name", "options_model", "signature", "working_inputs", "variants",
                                           "implementations")
    name: ClassVar[str]
    options_model: ClassVar[type[BaseModel]]
    signature: ClassVar[tuple[str, ...]]  # implementation's tensor parameters, in order (absent ones get None)
    working_inputs: ClassVar[tuple[str, ...]]  # inputs in the working dtype (what a `dtype` sweep sets)
    variants: ClassVar[dict[str, tuple[str, ...]]]  # framework -> its variant names
    implementations: ClassVar[dict[str, str]]  # framework -> "package.module:Class" (or "file.py:Class")
    upstream: ClassVar[dict[str, str]] = {"out": "grad_out"}  # output -> input holding its upstream gradient
    no_grad: ClassVar[tuple[str, ...]] = ()  # inputs never differentiated
    # framework -> {input or output: axis permutation}: what that framework is handed is np.transpose(a, perm);
    # its outputs and gradients come back through the inverse, so all is compared in the case's layout.
    layouts: ClassVar[dict[str, dict[str, tuple[int, ...]]]] = {}
    # framework -> "package.module:name" (or "file.py:name") of the family's float64 reference, a function
    # marked @reference(...): the same signature as a variant, handed every float input widened exactly to
    # float64 (and the upstream gradients likewise), run eagerly on the CPU in that framework's worker. It
    # follows Megatron's formula (autograd where Megatron uses autograd, its hand-written backward where it
    # has one). A family without one gets no arbiter: the comparison says so, with no_reference's reason.
    reference: ClassVar[dict[str, str]] = {}
    no_reference: ClassVar[str] = "this op family declares no float64 reference"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [a for a in cls.REQUIRED if not hasattr(cls, a)]
        if missing:
            raise TypeError(f"op family {cls.__name__} does not set {', '.join(missing)}")
        if set(cls.variants) != set(cls.implementations):
            raise TypeError(f"op family {cls.__name__}: variants name frameworks {sorted(cls.variants)}, "
                            f"implementations {sorted(cls.implementations)}")
        for framework, perms in cls.layouts.items():
            for tensor, perm in perms.items():
                if sorted(perm) != list(range(len(perm))):
                    raise TypeError(f"op family {cls.__name__}: layout of {tensor} on {framework} is not an axis "
                                    f"permutation: {perm}")

    def parse_options(self, raw: dict):
        try:
            return self.options_model(**raw)
        except ValidationError as error:
            location, message = validation_problem(error)
            raise FieldProblem(("options", *location), message) from None

    def options(self, case: Case):
        return self.parse_options(case.options)

    # -- per family -------------------------------------------------------------------------------------

    @abstractmethod
    def validate_inputs(self, case: Case) -> None:
        """Shapes and dtypes the op needs: raise FieldProblem(path, message)."""

    def forward_inputs(self, case: Case) -> list[str]:
        """Inputs passed to the implementation, in signature order."""
        return [name for name in self.signature if name in case.inputs]

    def generate_input(self, name: str, case: Case, rng) -> np.ndarray | None:
        """Inputs the family makes itself (e.g. a routing map); None: the generic generator."""
        return None

    def grad_inputs(self, case: Case) -> list[str]:
        """Inputs whose gradients are captured: float ones not marked as taking none."""
        return [n for n in self.forward_inputs(case) if case.inputs[n].dtype in FLOAT_DTYPES
                and n not in self.no_grad and case.inputs[n].grad]

    def tensor_axes(self, case: Case) -> dict[str, list[str]]:
        """Names of a tensor's last two axes, where the op knows them (for heatmap labels)."""
        return {}

    def tensor_notes(self, case: Case) -> dict[str, str]:
        """What a reader must know to read a tensor's comparison (e.g. its layout)."""
        return {}

    def deterministic(self, case: Case) -> bool:
        """Whether sides run under their framework's deterministic algorithms (forward and backward)."""
        return False

    def extra_outputs(self, case: Case) -> list[str]:
        """Forward outputs captured beside the differentiated ones (no upstream gradient)."""
        return []

    def ranks(self, case: Case, framework: str) -> int:
        """Processes a side of `framework` runs on (a tensor-parallel group); 1: one process."""
        return 1

    def shardings(self, case: Case, framework: str) -> dict[str, Sharding]:
        """How inputs and outputs are split across those ranks (absent: replicated). Each rank is handed its
        pieces of the inputs; a gradient is split as its input, an output's upstream gradient as the output."""
        return {}

    # -- shared -----------------------------------------------------------------------------------------

    @staticmethod
    def require(case: Case, shapes: dict[str, list[int]], dtype_of: str = "", same_dtype: tuple = ()) -> None:
        """Inputs present in the case must have these shapes, and those in same_dtype dtype_of's dtype."""
        for name, shape in shapes.items():
            spec = case.inputs.get(name)
            if spec is not None and spec.shape != shape:
                raise FieldProblem(("inputs", name, "shape"), f"{name} must have shape {shape}, got {spec.shape}")
        for name in same_dtype:
            spec = case.inputs.get(name)
            if spec is not None and spec.dtype != case.inputs[dtype_of].dtype:
                raise FieldProblem(("inputs", name, "dtype"), f"{name} must have {dtype_of}'s dtype {case.inputs[dtype_of].dtype}")

    def tensor_names(self, case: Case) -> list[str]:
        """Captured tensors in forward -> backward order."""
        return list(self.upstream) + self.extra_outputs(case) + [f"grad.{n}" for n in self.grad_inputs(case)]

    def validate(self, case: Case) -> None:
        self.options(case)
        needed = self.forward_inputs(case) + list(self.upstream.values())
        for name in needed:
            if name not in case.inputs:
                raise FieldProblem(("inputs",), f"missing input {name!r} (this case needs {', '.join(needed)})")
        for name in case.inputs:
            if name not in needed:
                raise FieldProblem(("inputs", name), f"input {name!r} is not used by these options (needs {', '.join(needed)})")
        for name, perm in self.layouts_of(case).items():
            if name in case.inputs and len(perm) != len(case.inputs[name].shape):
                raise FieldProblem(("inputs", name, "shape"), f"{name} is {len(perm)}-D for this op, got {case.inputs[name].shape}")
        self.validate_inputs(case)
        for side_name, side in case.sides.items():
            if side.framework not in self.variants:
                raise FieldProblem(("sides", side_name, "framework"), f"op {self.name} has no {side.framework} "
                                   f"implementations (it has {', '.join(self.variants)})")
            variants = self.variants[side.framework]
            impl = side.implementation
            if impl is None:
                raise FieldProblem(("sides", side_name), f"impl is required: one of {', '.join(variants)} or module:function")
            if not side.is_user_function and impl not in variants:
                raise FieldProblem(("sides", side_name, "impl"),
                                   f"unknown {side.framework} implementation {impl!r}; built-in: {', '.join(variants)}")
        names = self.tensor_names(case)
        for name in case.expect.tensors:
            if name not in names:
                raise FieldProblem(("expect", "tensors", name), f"no tensor {name!r}; this case captures {', '.join(names)}")
        for where, expectation in [(("expect", "all"), case.expect.all),
                                   *((("expect", "tensors", n), e) for n, e in case.expect.tensors.items())]:
            unknown = sorted(sides_named(expectation) - set(case.sides))
            if unknown:
                raise FieldProblem(where, f"{expectation.describe()} names side {unknown[0]!r}; the sides are "
                                          f"{', '.join(case.sides)}")

    def layouts_of(self, case: Case) -> dict[str, tuple[int, ...]]:
        """Every permuted tensor of the case's sides, by name (for shape checks)."""
        return {name: perm for framework in {s.framework for s in case.sides.values()}
                for name, perm in self.layouts.get(framework, {}).items()}


# -- implementations --------------------------------------------------------------------------------------


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


def reference(provenance: str | Callable[[dict], str], source: Callable[[dict], Any] | None = None):
    """Marks a module-level function as an op family's float64 reference (named in `OpFamily.reference`)."""

    def mark(fn: Callable) -> Impl:
        return Impl(fn, provenance, source)

    return mark


class Variant(staticmethod, Generic[P, R]):
    """A variant: a staticmethod (so `Cls.name(*tensors, options)` calls the plain function, and mypy types it
    so) that also carries the provenance of the code it runs."""

    def __init__(self, fn: Callable[P, R], provenance: str | Callable[[dict], str],
                 source: Callable[[dict], Any] | None = None) -> None:
        super().__init__(fn)
        self.provenance, self.source = provenance, source

    if TYPE_CHECKING:  # typeshed's bare staticmethod gives Callable[..., Any]; keep the function's signature
        def __get__(self, instance: object, owner: type | None = None, /) -> Callable[P, R]: ...

    def impl(self) -> Impl:
        return Impl(self.__func__, self.provenance, self.source)


def variant(provenance: str | Callable[[dict], str], source: Callable[[dict], Any] | None = None
            ) -> Callable[[Callable[P, R] | staticmethod[P, R]], Variant[P, R]]:
    """Marks a function in an Implementations class as the variant of that name: fn(*signature, options).
    It becomes a staticmethod. The function may be written with or without @staticmethod beneath; with it,
    mypy checks its body as a plain function (without, it takes the first parameter for `self`)."""

    def mark(fn: Callable[P, R] | staticmethod[P, R]) -> Variant[P, R]:
        function = fn.__func__ if isinstance(fn, staticmethod) else fn
        if not callable(function):
            raise TypeError(f"@variant(...) must decorate a function, not {function!r}")
        return Variant(function, provenance, source)

    return mark


class Implementations:
    """Base of a framework's implementations of a family:

        class SwigluPaddle(Implementations, family=SwigluFamily, framework="paddle"):
            @variant(provenance="...")
            @staticmethod  # optional: lets mypy check the body
            def fp32_island(x, bias, probs, options): ...
    """

    family: ClassVar[type[OpFamily]]
    framework: ClassVar[str]

    def __init_subclass__(cls, family: type[OpFamily], framework: str, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.family, cls.framework = family, framework
        declared = set(family.variants.get(framework, ()))
        present = set(cls._variants())
        if declared != present:
            unmarked = sorted(name for name in declared - present if name in vars(cls))
            hint = f" ({', '.join(unmarked)} not marked @variant(provenance=...) outermost)" if unmarked else ""
            raise TypeError(f"{cls.__name__}: {family.name} on {framework} declares variants "
                            f"{sorted(declared)}, implemented {sorted(present)}{hint}")

    @classmethod
    def _variants(cls) -> dict[str, Variant[..., Any]]:
        return {name: v for name, v in vars(cls).items() if isinstance(v, Variant)}

    @classmethod
    def impls(cls) -> dict[str, Impl]:
        return {name: v.impl() for name, v in cls._variants().items()}


def code_origin(obj: Any) -> str | None:
    """"<distribution> <version>, <file>" for the installed file that defines obj; None when it belongs to
    no installed distribution (a user's file) or has no Python source."""
    try:
        path = inspect.getsourcefile(obj) or inspect.getfile(obj)
    except TypeError:  # built-in or C code
        return None
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    distribution = distribution_of((module or "").partition(".")[0])
    if not path or not distribution:
        return None
    version = version_of(distribution)
    return f"{distribution} {version}, {path}" if version else None


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
            obj: Any = module
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute, None)
            if obj is not None:
                found.append(obj)
            break
    return found
