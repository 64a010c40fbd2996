"""What both side runners share: finding the implementation and describing the environment."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from harness.case import Case, SideSpec, user_function_file
from harness.digest import Digest
from harness.ops import Impl, family_for, framework_impls


def load_impl(case: Case, side: SideSpec) -> Impl:
    family = family_for(case.op)
    name = side.impl or family.default_impl(side.framework)
    if not side.is_user_function:
        return framework_impls(case.op, side.framework)[name]
    target, function = name.rsplit(":", 1)
    if target.endswith(".py"):
        path = user_function_file(case.source, target).resolve()  # beside the case, never the working directory
        spec = importlib.util.spec_from_file_location(f"xfalign_user_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        provenance = f"user function {path}:{function} (sha256 {digest})"
    else:
        module = importlib.import_module(target)
        provenance = f"user function {target}:{function} ({getattr(module, '__file__', '?')})"
    if not callable(getattr(module, function, None)):
        raise UserFunctionError(f"user function {name}: {target} defines no function {function!r}")
    return Impl(getattr(module, function), provenance)


class UserFunctionError(TypeError):
    """An implementation returned something the harness cannot capture; the message says what was expected."""


def _type_name(value) -> str:
    return "None" if value is None else type(value).__name__


def _tracks_grad(tensor) -> bool:
    if hasattr(tensor, "stop_gradient"):  # paddle
        return not tensor.stop_gradient
    return bool(getattr(tensor, "requires_grad", False))  # torch


def _check_result(result, case: Case, side: SideSpec, tensor_type: type, differentiable: bool) -> dict:
    """The implementation's outputs by name: a tensor (the first output) or a dict holding every output
    that gets an upstream gradient; each a tensor of the side's framework, attached to the autograd graph
    where gradients are taken."""
    family = family_for(case.op)
    who = f"user function {side.impl}" if side.is_user_function else \
        f"{side.framework} implementation {side.impl or family.default_impl(side.framework)}"
    kind = "a torch tensor" if side.framework == "megatron" else f"a {side.framework} tensor"
    names = list(family.upstream)
    expected = (f"expected {kind} ({names[0]}) or " if len(names) == 1 else "expected ") + \
        f"a dict with {', '.join(repr(n) for n in names)}"
    if isinstance(result, dict):
        missing = [n for n in names if n not in result]
        if missing:
            keys = ", ".join(repr(k) for k in list(result)[:8]) or "no keys"
            raise UserFunctionError(f"{who} returned a dict without {', '.join(repr(n) for n in missing)} "
                                    f"(it has {keys}); {expected}")
        outputs = result
    elif len(names) == 1 and isinstance(result, tensor_type):
        outputs = {names[0]: result}
    else:
        raise UserFunctionError(f"{who} returned {_type_name(result)}; {expected}")
    for name in [*names, *family.extra_outputs(case)]:
        if name in outputs and not isinstance(outputs[name], tensor_type):
            raise UserFunctionError(f"{who} returned {name!r} as {_type_name(outputs[name])}; expected {kind}")
    if differentiable:
        for name in names:
            if not _tracks_grad(outputs[name]):
                raise UserFunctionError(f"{who} returned {name!r} detached from the inputs (it does not require "
                                        f"grad); expected {kind} computed from the inputs, so that gradients can "
                                        "be taken through it")
    return outputs


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
    outputs = _check_result(result, case, side, type(next(iter(tensors.values()))), bool(differentiable))
    backward([outputs[name] for name in family.upstream], [tensors[g] for g in family.upstream.values()])
    captured = {name: to_numpy(outputs[name]) for name in [*family.upstream, *family.extra_outputs(case)] if name in outputs}
    for name in family.grad_inputs(case):
        grad = grad_of(tensors[name])
        if grad is not None:
            captured[f"grad.{name}"] = to_framework_layout(name, to_numpy(grad))
    return SideOutput(captured, consumed, impl.provenance_for(options))
