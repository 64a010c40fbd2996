"""Replay: run one module of side B on what side A's module saw, to stop error accumulation.

A's capture holds, for one call of a module, its inputs, its parameters as the step's forward pass read them and its
outputs. Replay puts A's inputs and parameters into B's names and layouts (the map's `to_b`), runs B's
module (or the B modules the map pairs with it, each on its own inputs) forward, brings the outputs back
into A's names and layouts (`to_a`) and compares them with A's captured outputs, bitwise.

Every parameter under B's module (its sub-modules' too) takes A's value for it, of the same shape and dtype
(or one that widens exactly); B's own values are put back afterwards, also when B's module raises. A
parameter A's capture holds no value for keeps B's own and is listed (`not_loaded`). The verdicts:

- every output equal: B's module computes what A's does from the same inputs, so a difference seen
  where the two captures are compared is inherited from upstream ("inherited");
- an output differs: the module itself differs ("differs");
- none of A's outputs has a B counterpart through the map (B's module computes something else, e.g. it
  adds a bias A's module hands on): "no counterpart"; replay the enclosing module instead.

With exact=True, float64 copies of A's module and of B's run on the same inputs, and each side's output is
measured against the exact one: which side is closer to exact (harness.capture.replay_exact).

Framework-neutral: the framework comes from the module (harness.frameworks adapters).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.capture.replay_exact import replay_exact
from harness.capture.replay_run import ReplayError, ReplayResult, captured_parameter, first_line, run_modules
from harness.compare.pairs import originate
from harness.dtypes import dtype_name
from harness.store.dump import Dump
from harness.store.tree import Tree, read_tree
from harness.store.tree_format import ROOT, TensorName, call_tensor

if TYPE_CHECKING:
    from harness.capture.mapping import TensorMap
    from harness.frameworks.base import FrameworkAdapter

# a parameter of A's dtype (left) loads exactly into one of these dtypes of B's
EXACT_WIDENING = {"bfloat16": ("float32", "float64"), "float16": ("float32", "float64"), "float32": ("float64",)}


def replay(module_b: Any, tree_a: str | Path | Tree, module_a: str, tensor_map: TensorMap | None = None,
           step: int = 0, call: int = 0, exact: bool = False, model_a: Any = None) -> ReplayResult:
    """Replay call `call` of A's module `module_a` (its path in A's capture) in step `step` on B's module.

    module_b: B's module object, or {B module path: object} when the map pairs several B modules with
    module_a (a fused projection on one side, two on the other). Each B module gets its inputs through the
    map; a B module whose inputs the map leaves out (the map's ignore list) takes the first one's.
    exact: also run float64 copies of A's module (`model_a`: A's model, or the module at `module_a` itself)
    and of B's on A's inputs, and say which side's output is closer to exact (`result.exact`, an
    harness.capture.replay_exact.ExactReplay; a side whose copy cannot run is N/A, with the reason).
    """
    from harness.capture.mapping import load_map

    tensor_map = tensor_map or load_map(None)
    tree = tree_a if isinstance(tree_a, Tree) else read_tree(tree_a)
    dump = tree.step(step)
    modules = _modules_b(module_b, module_a, tensor_map)
    adapter = _adapter(next(iter(modules.values())))

    inputs_a = _call_tensors(dump, module_a, call, "input")
    outputs_a = _call_tensors(dump, module_a, call, "output")
    if not outputs_a:
        raise ReplayError(f"{tree.path}: step {step}: no output of {module_a} call {call} was stored "
                          "(capture it in full, or give the module's path as captured)")
    given_b = tensor_map.to_b({**inputs_a, **_parameters_under(dump, module_a)})

    with _parameters_of_a(adapter, modules, given_b, module_a) as (params_loaded, not_loaded):
        made_a = tensor_map.to_a(Dump({}, _run_b(adapter, modules, given_b, module_a, call))).tensors
        pairs, missing = [], []
        for name, array in outputs_a.items():
            if tensor_map.ignored("a", name):
                continue
            if name not in made_a:
                missing.append(name)
                continue
            pairs.append(originate(name, array, np.asarray(made_a[name])))
        result = ReplayResult(module_a, list(modules), step, call, pairs, params_loaded, missing, not_loaded=not_loaded)
        if exact:
            result.exact = replay_exact(result, inputs_a, outputs_a, made_a, model_a, modules, dump, given_b, tensor_map)
    return result


def _run_b(adapter: FrameworkAdapter, modules: dict[str, Any], arrays: dict[str, np.ndarray], module_a: str,
           call: int) -> dict[str, np.ndarray]:
    """run_modules on B's modules; what they raise, as a ReplayError naming them (the error chained)."""
    try:
        return run_modules(adapter, modules, arrays, call)
    except ReplayError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever B's module raises: said where, the error chained
        shapes = ", ".join(f"{name} {list(np.shape(array))}" for name, array in arrays.items() if ":input." in name)
        raise ReplayError(f"replay of {module_a}: B's {', '.join(modules)} raised {first_line(error)} when given A's "
                          f"inputs ({shapes or 'none'}); check that the map's entries give them in B's names and "
                          "layouts, and that these B modules are A's module's counterpart") from error


def _modules_b(module_b: Any, module_a: str, tensor_map: TensorMap) -> dict[str, Any]:
    if isinstance(module_b, Mapping):
        if not module_b:
            raise ReplayError(f"replay of {module_a}: no B module given")
        return dict(module_b)
    paired = tensor_map.module_pairs([module_a])[module_a]
    if len(paired) > 1:
        raise ReplayError(f"replay of {module_a}: the map pairs it with {', '.join(paired)}; give them as "
                          "{B module path: module}")
    return {paired[0] if paired else module_a: module_b}


def _adapter(module: Any) -> FrameworkAdapter:
    from harness.capture.api import adapter_of

    return adapter_of(module)


def _call_tensors(dump: Dump, module: str, call: int, role: str) -> dict[str, np.ndarray]:
    prefix = call_tensor(module, call, role, "")
    return {name: np.asarray(dump.tensors[name]) for name in dump.names if name.startswith(prefix) and name in dump.tensors}


def _parameters_under(dump: Dump, module_a: str) -> dict[str, np.ndarray]:
    """A's stored parameters of `module_a` and of every module under it (the capture names each after the
    nearest selected module at or above it)."""
    inside = module_a + "."
    return {name: np.asarray(dump.tensors[name]) for name in dump.tensors
            if (parsed := TensorName.parse(name)) is not None and parsed.role == "param"
            and (module_a == ROOT or parsed.module == module_a or parsed.module.startswith(inside))}


def _b_parameters(adapter: FrameworkAdapter, modules: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """Every parameter under B's modules, once: (the B module path it is given under, its path relative to
    that module, the parameter)."""
    seen: set[int] = set()
    for path, module in modules.items():
        for sub, child in adapter.named_modules(module):
            for name, param in adapter.own_parameters(child):
                if id(param) not in seen:
                    seen.add(id(param))
                    yield path, f"{sub}.{name}" if sub else name, param


@contextmanager
def _parameters_of_a(adapter: FrameworkAdapter, modules: dict[str, Any], arrays: dict[str, np.ndarray],
                     module_a: str) -> Iterator[tuple[bool, list[str]]]:
    """Every parameter under B's modules takes A's (mapped) value where `arrays` has one, and gets B's own back
    when the block ends, however it ends. Where the adapter cannot load parameters, B's own are checked to be
    A's bits instead (ReplayError naming the first that is not). Yields (whether every one took A's value, B's
    parameters A's capture gives no value for)."""
    saved: list[tuple[Any, np.ndarray]] = []
    loaded, not_loaded = True, []
    try:
        for path, relative, param in _b_parameters(adapter, modules):
            label = relative if path == ROOT else f"{path}.{relative}"
            found = captured_parameter(arrays, path, relative)
            if found is None:
                not_loaded.append(label)
                continue
            own = adapter.host_copy(param)
            wanted = _fitted(arrays[found], own, f"replay of {module_a}: B's parameter {label}")
            try:
                adapter.load_parameter(param, wanted)
            except NotImplementedError:
                loaded = False
                if own.tobytes() != wanted.tobytes():
                    raise ReplayError(f"replay of {module_a}: B's parameter {label} is not A's ({found}, through the "
                                      f"map) and the {adapter.name} adapter cannot load parameters; give B's module "
                                      "A's parameters before replaying") from None
                continue
            saved.append((param, own))
        yield loaded and not not_loaded, not_loaded
    finally:
        for param, own in reversed(saved):
            adapter.load_parameter(param, own)


def _fitted(value: np.ndarray, own: np.ndarray, what: str) -> np.ndarray:
    """A's value for a B parameter, in the parameter's dtype when that holds it exactly; ReplayError (starting
    with `what`) when its shape or dtype does not fit."""
    value = np.asarray(value)
    if value.shape != own.shape:
        raise ReplayError(f"{what} is {list(own.shape)}, A's value for it is {list(value.shape)}: add or fix the map's "
                          "entry for it (a transpose, a split), or replay the module A's value belongs to")
    have, given = dtype_name(own.dtype), dtype_name(value.dtype)
    if have == given:
        return value
    if have in EXACT_WIDENING.get(given, ()):
        return value.astype(own.dtype)
    raise ReplayError(f"{what} is {have}, A's value for it {given}, which {have} does not hold exactly: give B's "
                      f"module A's dtype ({given}) to replay it")


__all__ = ["ROOT", "ReplayError", "ReplayResult", "replay"]
