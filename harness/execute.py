"""One side's run of an op, the same for every framework: load the implementation, hand it the inputs in
its framework's layout, run forward and backward, capture outputs and gradients in the case's layout."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from dataclasses import dataclass, field

import numpy as np

from harness.case import Case, SideSpec, user_function_file
from harness.frameworks import FrameworkAdapter
from harness.ops import Impl, OpFamily, family_for, framework_impls
from harness.store.digest import Digest


class UserFunctionError(TypeError):
    """An implementation returned something the harness cannot capture; the message says what was expected."""


def _user_function(case: Case, target: str) -> tuple:
    """(function, provenance) of `file.py:function` (beside the case, never the working directory) or
    `module:function`."""
    where, function = target.rsplit(":", 1)
    if where.endswith(".py"):
        path = user_function_file(case.source, where).resolve()
        spec = importlib.util.spec_from_file_location(f"xfalign_user_{path.stem}", path)
        assert spec is not None and spec.loader is not None  # a .py path always gets a spec with a source loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        provenance = f"user function {path}:{function} (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]})"
    else:
        module = importlib.import_module(where)
        provenance = f"user function {where}:{function} ({getattr(module, '__file__', '?')})"
    if not callable(getattr(module, function, None)):
        raise UserFunctionError(f"user function {target}: {where} defines no function {function!r}")
    return getattr(module, function), provenance


def load_impl(case: Case, side: SideSpec, adapter: FrameworkAdapter) -> Impl:
    """The side's implementation: a built-in variant, or a user function (with its own backward, wrapped
    as one differentiable function of the framework)."""
    impl = side.implementation
    assert impl is not None  # case validation (OpFamily.validate) requires an impl where the adapter has no default
    if not side.is_user_function:
        return framework_impls(case.op, side.framework, case.source)[impl]
    forward, provenance = _user_function(case, impl)
    if side.backward is None:
        return Impl(forward, provenance)
    backward, backward_provenance = _user_function(case, side.backward)
    return Impl(adapter.custom_function(forward, backward), f"{provenance}; backward: {backward_provenance}")


def _type_name(value) -> str:
    return "None" if value is None else type(value).__name__


def _check_result(result, case: Case, side: SideSpec, adapter: FrameworkAdapter, differentiable: bool) -> dict:
    """The implementation's outputs by name: a tensor (the first output) or a dict holding every output
    that gets an upstream gradient; each a tensor of the side's framework, attached to the autograd graph
    where gradients are taken."""
    family = family_for(case.op, case.source)
    who = f"user function {side.impl}" if side.is_user_function else \
        f"{side.framework} implementation {side.implementation}"
    kind, tensor_type = adapter.tensor_kind, adapter.tensor_type()
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
            if not adapter.tracks_grad(outputs[name]):
                raise UserFunctionError(f"{who} returned {name!r} detached from the inputs (it does not require "
                                        f"grad); expected {kind} computed from the inputs, so that gradients can "
                                        "be taken through it")
    return outputs


@dataclass
class SideOutput:
    tensors: dict[str, np.ndarray]  # forward -> backward order; a missing gradient is absent
    input_digests: dict[str, Digest]  # of the inputs as the framework held them (in the case's layout)
    provenance: str
    environment: dict = field(default_factory=dict)


def execute(case: Case, side: SideSpec, arrays: dict[str, np.ndarray], adapter: FrameworkAdapter,
            device: str, impl: Impl | None = None, rank: int = 0, world: int = 1) -> SideOutput:
    """Forward, backward with the generated upstream gradients, capture. `impl`: run this instead of the
    side's implementation, in the case's own layout (the float64 reference). In a world of several ranks the
    implementation is handed this rank's pieces of the inputs (the family's shardings) and what is captured
    is this rank's pieces of the outputs and gradients."""
    family = family_for(case.op, case.source)
    layouts = family.layouts.get(side.framework, {}) if impl is None else {}
    impl = impl or load_impl(case, side, adapter)
    options = family.options(case).model_dump()
    differentiable = set(family.grad_inputs(case))
    whole = arrays
    if world > 1:
        arrays = _pieces(family, case, side.framework, arrays, rank, world)

    def to_framework(name: str, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(array, layouts[name])) if name in layouts else array

    def from_framework(name: str, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(array, np.argsort(layouts[name]))) if name in layouts else array

    tensors = {name: adapter.to_tensor(to_framework(name, array), device, name in differentiable)
               for name, array in arrays.items()}
    consumed = {}
    for name, tensor in tensors.items():
        held = from_framework(name, adapter.to_numpy(tensor))
        # a rank's piece that holds exactly its bits stands for the whole input it was cut from
        exact_piece = world > 1 and held.shape == arrays[name].shape and held.tobytes() == arrays[name].tobytes()
        consumed[name] = Digest.of(whole[name] if exact_piece else held, xxh3=False)
    result = impl.fn(*(tensors.get(name) for name in family.signature), options)
    outputs = _check_result(result, case, side, adapter, bool(differentiable))
    adapter.backward([outputs[name] for name in family.upstream], [tensors[g] for g in family.upstream.values()])
    captured = {name: from_framework(name, adapter.to_numpy(outputs[name]))
                for name in [*family.upstream, *family.extra_outputs(case)] if name in outputs}
    for name in family.grad_inputs(case):
        grad = adapter.grad_of(tensors[name])
        if grad is not None:
            captured[f"grad.{name}"] = from_framework(name, adapter.to_numpy(grad))
    return SideOutput(captured, consumed, impl.provenance_for(options))


def _pieces(family: OpFamily, case: Case, framework: str, arrays: dict[str, np.ndarray], rank: int,
            world: int) -> dict[str, np.ndarray]:
    """This rank's pieces of the inputs: each as the family splits it; an output's upstream gradient as that
    output; the rest whole (replicated)."""
    shardings = family.shardings(case, framework)
    split_as = {name: name for name in arrays} | {grad: out for out, grad in family.upstream.items()}
    return {name: shardings[split_as[name]].shard(array, rank, world) if split_as[name] in shardings else array
            for name, array in arrays.items()}
