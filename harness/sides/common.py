"""What both side runners share: finding the implementation and describing the environment."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from harness.case import Case, SideSpec
from harness.digest import Digest
from harness.ops import Impl, family_for, framework_impls


def load_impl(case: Case, side: SideSpec) -> Impl:
    family = family_for(case.op)
    name = side.impl or family.default_impl(side.framework)
    if not side.is_user_function:
        return framework_impls(case.op, side.framework)[name]
    target, function = name.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target)
        beside_case = Path(case.source).parent / path
        path = (beside_case if beside_case.exists() else path).resolve()
        spec = importlib.util.spec_from_file_location(f"xfalign_user_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        provenance = f"user function {path}:{function} (sha256 {digest})"
    else:
        module = importlib.import_module(target)
        provenance = f"user function {target}:{function} ({getattr(module, '__file__', '?')})"
    return Impl(getattr(module, function), provenance)


@dataclass
class SideOutput:
    tensors: dict[str, np.ndarray]  # forward -> backward order; a missing gradient is absent
    input_digests: dict[str, Digest]  # of the inputs as the framework held them
    provenance: str
    environment: dict = field(default_factory=dict)


def run_family(case: Case, side: SideSpec, arrays: dict[str, np.ndarray], to_tensor: Callable,
               to_numpy: Callable, backward: Callable, grad_of: Callable) -> SideOutput:
    """Forward, backward with the generated upstream gradients, capture: the same for every framework."""
    family = family_for(case.op)
    impl = load_impl(case, side)
    options = family.options(case).model_dump()
    differentiable = set(family.grad_inputs(case))
    transposed = set(family.transposed.get(side.framework, ()))

    def to_framework_layout(name: str, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array.swapaxes(-1, -2)) if name in transposed else array

    tensors = {name: to_tensor(to_framework_layout(name, array), name in differentiable) for name, array in arrays.items()}
    consumed = {name: Digest.of(to_framework_layout(name, to_numpy(t))) for name, t in tensors.items()}
    result = impl.fn(*(tensors.get(name) for name in family.signature), options)
    outputs = result if isinstance(result, dict) else {next(iter(family.upstream)): result}
    backward([outputs[name] for name in family.upstream], [tensors[g] for g in family.upstream.values()])
    captured = {name: to_numpy(outputs[name]) for name in [*family.upstream, *family.extra_outputs(case)] if name in outputs}
    for name in family.grad_inputs(case):
        grad = grad_of(tensors[name])
        if grad is not None:
            captured[f"grad.{name}"] = to_framework_layout(name, to_numpy(grad))
    return SideOutput(captured, consumed, impl.provenance_for(options))
