"""What replay (harness.capture.replay) and its float64 replay (harness.capture.replay_exact) share: the result of a
replay, running modules on a captured call's inputs, finding a parameter's capture name, an error's first line."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from harness.compare.pairs import Pair
from harness.errors import XfalignError
from harness.store.tree_format import ROOT, call_tensor, param_tensor

if TYPE_CHECKING:
    from harness.compare.replay import ExactReplay
    from harness.frameworks.base import FrameworkAdapter

Verdict = Literal["inherited", "differs", "no counterpart"]


class ReplayError(XfalignError):
    """A replay that cannot run: the module call is not in A's capture, a tensor it needs is missing."""


@dataclass
class ReplayResult:
    module_a: str
    modules_b: list[str]
    step: int
    call: int
    outputs: list[Pair]  # A's captured output vs B's replayed one, in A's names and layouts
    params_loaded: bool  # every parameter under B's modules took A's value (else see not_loaded, or the adapter
    # cannot load parameters and B's own were checked equal to A's)
    not_replayed: list[str] = field(default_factory=list)  # A outputs that B's replay does not make
    exact: ExactReplay | None = None  # replay(..., exact=True): each side against its module run in float64
    not_loaded: list[str] = field(default_factory=list)  # B's parameters A's capture gives no value for: B's own used

    @property
    def verdict(self) -> Verdict:
        """inherited: B's module makes A's outputs bitwise from A's inputs; differs: it does not; no
        counterpart: none of A's outputs has a B counterpart in the map (replay the enclosing module)."""
        if not self.outputs:
            return "no counterpart"
        return "inherited" if all(pair.bitwise for pair in self.outputs) else "differs"

    @property
    def first_difference(self) -> Pair | None:
        return next((pair for pair in self.outputs if not pair.bitwise), None)


def run_modules(adapter: FrameworkAdapter, modules: dict[str, Any], arrays: dict[str, np.ndarray], call: int) -> dict[str, np.ndarray]:
    """Run each module (path -> object) on its inputs of call `call` in `arrays` (in its own names); a module
    whose inputs `arrays` lacks takes the first one's. Its outputs' tensor leaves as arrays, by capture name."""
    made: dict[str, np.ndarray] = {}
    first_inputs: tuple[list, dict] | None = None
    for path, module in modules.items():
        args, kwargs = _call_arguments(arrays, path, call)
        if not args and not kwargs and first_inputs is not None:
            args, kwargs = first_inputs
        first_inputs = first_inputs or (args, kwargs)
        device = adapter.model_device(module)
        output = module(*[adapter.to_tensor(a, device, False) for a in args],
                        **{k: adapter.to_tensor(v, device, False) for k, v in kwargs.items()})
        for slot, tensor in _leaves(output, adapter.tensor_type()):
            made[call_tensor(path, call, "output", slot)] = adapter.to_numpy(tensor)
    return made


def _call_arguments(arrays: dict[str, np.ndarray], module: str, call: int) -> tuple[list, dict]:
    """B's positional inputs (input.0, input.1, ...) and keyword inputs of one call."""
    prefix = call_tensor(module, call, "input", "")
    slots = {name[len(prefix):]: array for name, array in arrays.items() if name.startswith(prefix)}
    positional = sorted((int(slot), array) for slot, array in slots.items() if slot.isdigit())
    if [index for index, _ in positional] != list(range(len(positional))):
        raise ReplayError(f"replay: inputs of {module} call {call} are not numbered 0..n-1: {sorted(slots)}")
    return [array for _, array in positional], {slot: array for slot, array in slots.items() if not slot.isdigit()}


def captured_parameter(names: Collection[str], module: str, relative: str) -> str | None:
    """The capture name among `names` of the parameter `relative` (a dotted path) of `module`: named after the
    module it sits in, or any module above it (the nearest selected one, in the capture), deepest first."""
    parts = ([] if module == ROOT else module.split(".")) + relative.split(".")
    for k in range(len(parts) - 1, -1, -1):
        name = param_tensor(".".join(parts[:k]) or ROOT, "param", ".".join(parts[k:]))
        if name in names:
            return name
    return None


def first_line(error: BaseException) -> str:
    """The error's kind and its first line of words (Paddle's "(NotFound) ..." line where there is one)."""
    lines = [line.strip() for line in str(error).splitlines() if any(c.isalpha() for c in line)]
    text = next((line for line in lines if re.match(r"\(\w+\) ", line)), lines[0] if lines else "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _leaves(value: Any, tensor_type: type) -> list[tuple[str, Any]]:
    """Tensor leaves of an output, numbered in order as the capture numbers them."""
    found: list[tuple[str, Any]] = []

    def walk(item: Any) -> None:
        if isinstance(item, tensor_type):
            found.append((str(len(found)), item))
        elif isinstance(item, (tuple, list, dict)):
            for child in item.values() if isinstance(item, dict) else item:
                walk(child)

    walk(value)
    return found
