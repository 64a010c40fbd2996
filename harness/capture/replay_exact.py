"""Float64 replay: the replayed module of each side run in float64 on A's captured inputs, to say which side's
output is closer to exact (`replay(..., exact=True, model_a=...)`; `ReplayResult.exact`).

- Each side's module is copied, the user's modules left as they are: a deep copy of its modules, parameters and
  buffers (other attributes, such as a config or a process group, are shared, not copied), widened exactly to
  float64 by its framework's adapter (FrameworkAdapter.float64_copy: torch `.double()`, Paddle
  `.to(dtype="float64")`; floating parameters and buffers; bfloat16, float16 and float32 values are all
  float64 values). A's copy takes A's captured parameters (widened) where
  the capture stored them; B's copy is made after replay loaded A's parameters into B's module (through the map).
- Both copies are fed A's captured inputs widened exactly to float64 (B's through the map, as replay feeds B),
  forward only (replay runs forward only), inside FrameworkAdapter.no_grad_eager: without autograd; torch
  eagerly (stance force_eager: a torch.compile'd function runs its Python body, as the op cases' float64
  reference does).
- The exact value of an output is A's float64 output; B's (brought into A's names and layouts by the map) when
  A's copy cannot run or no A module is given. Each side's output (A's as captured, B's as replayed) is
  measured against it by harness.compare.arbiter.arbitrate (ULP to the correctly rounded value, normwise error
  in units of the dtype's unit roundoff u, the share of elements where each side is closer); `closer` names
  the side of smaller normwise error (fewer NaN/Inf mismatches first).
- Where both copies ran, the other float64 output against the exact one is the `spread`. The copies compute one
  function when their normwise difference is at most AGREE_U u (harness.compare.replay) of the output's dtype: taking either as exact
  then moves each side's normwise error by at most AGREE_U u (triangle inequality). A larger spread means the
  modules compute different functions (a bias added on one side only, say), or a copy does not compute in
  float64 (a cast to a narrower dtype written into its forward): `closer` is then measured against A's function.
- A copy that cannot be made or run (a kernel without float64, say) is N/A for its side, with the reason; with
  neither side's, every output is N/A.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from harness.capture.replay_run import ReplayResult, captured_parameter, first_line, run_modules
from harness.compare.arbiter import arbitrate
from harness.compare.exact import ExactError, error_to_exact
from harness.compare.pairs import originate
from harness.compare.replay import ExactOutput, ExactReplay
from harness.dtypes import FLOAT_DTYPES, dtype_name
from harness.store.dump import Dump
from harness.store.tree_format import ROOT

if TYPE_CHECKING:
    from harness.capture.mapping import TensorMap
    from harness.frameworks.base import FrameworkAdapter

SIDES = ("A", "B")
class _CannotRun(Exception):
    """A side's float64 copy cannot be made or run; the message says why."""


def replay_exact(result: ReplayResult, inputs_a: dict[str, np.ndarray], outputs_a: dict[str, np.ndarray],
                 made_a: Mapping[str, np.ndarray], model_a: Any, modules_b: dict[str, Any], dump: Dump,
                 given_b: dict[str, np.ndarray], tensor_map: TensorMap) -> ExactReplay:
    """The float64 replay of `result`'s module call (module note). inputs_a, outputs_a: A's captured inputs and
    outputs of the call; made_a: B's replayed outputs in A's names; modules_b: B's modules (path -> object), A's
    parameters loaded; dump: A's captured step; given_b: A's inputs and parameters in B's names (what replay fed B)."""
    notes: list[str] = []
    exact: dict[str, dict[str, np.ndarray]] = {}
    not_run: dict[str, str] = {}
    try:
        if model_a is None:
            raise _CannotRun("no module given (replay(..., model_a=A's model))")
        module = _module_at(model_a, result.module_a)
        adapter = _adapter(module)
        twin = _float64_copy(module, adapter)
        notes += _load_captured(twin, adapter, result.module_a, dump)
        exact["A"] = _run(adapter, lambda: run_modules(adapter, {result.module_a: twin}, _widened(inputs_a), result.call))
    except _CannotRun as error:
        not_run["A"] = str(error)
    try:
        adapter = _adapter(next(iter(modules_b.values())))
        twins = {path: _float64_copy(module, adapter) for path, module in modules_b.items()}
        made = _run(adapter, lambda: run_modules(adapter, twins, _widened(given_b), result.call))
        exact["B"] = {name: np.asarray(array) for name, array in tensor_map.to_a(Dump({}, made)).tensors.items()}
    except _CannotRun as error:
        not_run["B"] = str(error)

    reference: Literal["A", "B"] | None = "A" if "A" in exact else "B" if "B" in exact else None
    values = {name: array for name, array in exact.get(reference or "", {}).items() if name in outputs_a}
    notes += [f"side {reference}'s float64 copy made {name} as {dtype_name(array.dtype)}: it rounds inside, so this is "
              "not an exact value" for name, array in values.items() if dtype_name(array.dtype) != "float64"]
    missing = None if reference else "no float64 copy ran (" + "; ".join(f"side {s}: {w}" for s, w in not_run.items()) + ")"
    pairs = result.outputs + [originate(name, outputs_a[name], None) for name in result.not_replayed]
    outputs = []
    for pair in pairs:
        b = made_a.get(pair.name)
        pair.exact = arbitrate(outputs_a[pair.name], None if b is None else np.asarray(b), values.get(pair.name), SIDES,
                               missing, pair.name)
        outputs.append(ExactOutput(pair, *_spread(pair.name, exact, not_run)))
    return ExactReplay(result.module_a, result.modules_b, result.step, result.call, reference, not_run, outputs, values, notes)


def _spread(name: str, exact: dict[str, dict[str, np.ndarray]], not_run: dict[str, str]) -> tuple[ExactError | None, str | None]:
    if not_run:
        return None, " and ".join(f"side {side}'s" for side in not_run) + " float64 copy did not run"
    reference, other = exact["A"].get(name), exact["B"].get(name)
    if reference is None or other is None:
        return None, f"side {'A' if reference is None else 'B'}'s float64 copy made no {name}"
    if reference.shape != other.shape or dtype_name(other.dtype) != "float64":
        return None, f"side B's float64 copy made {name} as {dtype_name(other.dtype)} {list(other.shape)}"
    return error_to_exact(other, reference.astype(np.float64, copy=False)), None


def _module_at(model: Any, path: str) -> Any:
    """The module at `path` in `model`, or `model` itself when it has none there (it is that module)."""
    if path == ROOT:
        return model
    return dict(_adapter(model).named_modules(model)).get(path, model)


def _adapter(module: Any) -> FrameworkAdapter:
    from harness.capture.api import CaptureError, adapter_of

    try:
        return adapter_of(module)
    except CaptureError as error:
        raise _CannotRun(str(error)) from None


def _widened(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float arrays widened to float64 (exact: every narrower float is a float64); others as they are."""
    return {name: np.asarray(array).astype(np.float64) if dtype_name(np.asarray(array).dtype) in FLOAT_DTYPES else array
            for name, array in arrays.items()}


def _float64_copy(module: Any, adapter: FrameworkAdapter) -> Any:
    """A deep copy of the module's modules, parameters and buffers (its other attributes shared), widened to float64."""
    modules = [m for _, m in adapter.named_modules(module)]
    skip = {id(m) for m in modules}
    tensor = adapter.tensor_type()
    shared = {id(value): value for m in modules for value in vars(m).values()
              if id(value) not in skip and not isinstance(value, (dict, list, tuple, set, tensor))}
    try:
        twin = copy.deepcopy(module, shared)
    except Exception as error:  # noqa: BLE001 - whatever the module holds that cannot be copied: N/A, said why
        raise _CannotRun(f"cannot copy {type(module).__name__}: {first_line(error)}") from None
    try:
        return adapter.float64_copy(twin)
    except NotImplementedError:
        raise _CannotRun(f"no float64 widening for a {type(module).__module__}.{type(module).__name__}") from None


def _load_captured(twin: Any, adapter: FrameworkAdapter, module_a: str, dump: Dump) -> list[str]:
    """Put A's captured parameters (widened) into A's float64 copy; notes for those the capture did not store."""
    kept = []
    for path, module in adapter.named_modules(twin):
        for name, param in adapter.own_parameters(module):
            relative = f"{path}.{name}" if path else name
            stored = captured_parameter(dump.tensors, module_a, relative)
            if stored is None:
                kept.append(relative)
                continue
            array = np.asarray(dump.tensors[stored])
            if tuple(array.shape) != tuple(param.shape):
                raise _CannotRun(f"A's captured {stored} is {list(array.shape)}, the module's {relative} {list(param.shape)}")
            adapter.load_parameter(param, array.astype(np.float64))
    return [f"side A's parameters not stored in the capture, taken from the module given: {', '.join(kept)}"] if kept else []


def _run(adapter: FrameworkAdapter, forward: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Run `forward()` (on float64 copies of `adapter`'s framework) without autograd, eagerly; a failure is
    N/A, said why."""
    with adapter.no_grad_eager():
        try:
            return forward()
        except Exception as error:  # noqa: BLE001 - a kernel without float64, and the like: N/A, said why
            raise _CannotRun(f"cannot run in float64: {first_line(error)}") from None


