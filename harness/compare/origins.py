"""Which module made each difference of a step of two capture trees (an origin), and which differences were only
handed on from an earlier one (inherited). Computed once per step by harness.compare.tree (StepComparison.origins);
the reporters read it.

A tensor compared on both sides that is not bitwise equal is an origin when what it was computed from is equal:

- a call's output (`M#c:output.*`, forward): the call's inputs and M's parameters are bitwise equal (or it has
  none: a module that makes its output from no tensor, rotary tables say), and, for a
  module with selected submodules, none of the submodule calls within this call is an origin (else that child
  explains it; with none, M's own code between them made it);
- a parameter gradient (`M:grad.*`, backward): M's parameters and every tensor of M's calls and of its
  submodules' calls (inputs, outputs, the gradients arriving at outputs) are bitwise equal, and at least one
  gradient arriving at M's outputs was recorded: M's own backward made it. (A parameter also used outside M,
  tied weights, can be named wrongly: its gradient sums both uses.)
- a gradient arriving at an output (`M#c:grad_output.*`), the loss, the step's scalars and what the optimizer
  step recorded: nothing recorded earlier in the step (execution order: parameters, forward, loss, backward,
  gradients, optimizer) differs. A capture records no gradient leaving a module, so the module whose backward
  made a gradient arriving at M's output (what consumed M's output) is not named; later such differences in
  the same step are counted inherited, also where they began on their own.

Parameters at the step's start and a call's inputs are never origins: they come from before the step or from
what called the module (its output, or its caller's own code, which makes the caller an origin). Everything else
that differs is inherited. A tensor one side lacks, or that the map could not make from B's digests, is not
classed, and counts as not equal when it is a source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from harness.compare.case import TensorResult
from harness.compare.pairs import OneSidedPair
from harness.store.tree_format import PHASE_ORDER, ModuleInfo, TensorName

Rule = Literal["inputs", "backward", "first"]  # why an origin is one (see the module's note); "" when inherited


@dataclass(frozen=True)
class Origin:
    """A differing tensor, classed: made by its module (origin) or handed on (inherited)."""

    origin: bool
    module: str  # the module its name names ("" where it names none)
    module_type: str | None  # its class name, where A's capture lists the module
    phase: str  # the phase of the record it is in (tree_format.Phase)
    rule: Rule | Literal[""] = ""  # what made it an origin


class _Record(Protocol):
    """What classify needs of a record of A's execution order (harness.compare.tree.RecordView)."""

    module: str
    call: int | None
    phase: str
    tensors: list[TensorResult]


def classify(records: Sequence[_Record], modules: list[ModuleInfo], types: dict[str, str],
             uncompared: set[str]) -> dict[str, Origin]:
    """Every differing tensor of one step (compared on both sides), by name: origin or inherited. `records`: A's,
    in A's record order (tree_format.Record); `modules`: A's selected modules; `uncompared`: tensors the map could
    not make from B's digests."""
    results = {result.name: result for record in records for result in record.tensors}
    compared = {name for name, result in results.items()
                if not isinstance(result.pair, OneSidedPair) and name not in uncompared}
    equal = {name for name in compared if results[name].pair.bitwise}
    names = _Names(results)
    descendants = _descendants(modules)
    origins: dict[str, Origin] = {}
    earlier_differs = False  # something earlier in execution order differs (or cannot be told equal)
    order = sorted(range(len(records)), key=lambda i: (PHASE_ORDER.get(records[i].phase, len(PHASE_ORDER)), i))
    for position, index in enumerate(order):
        record = records[index]
        for result in record.tensors:
            name = result.name
            if name not in compared or name in equal:
                continue
            parsed = TensorName.parse(name)
            module = parsed.module if parsed else record.module
            rule = _rule(parsed, records, (order, position), names, equal, descendants, origins, earlier_differs)
            origins[name] = Origin(rule is not None, module, types.get(module), record.phase, rule or "")
        earlier_differs = earlier_differs or any(r.name not in equal for r in record.tensors)
    return origins


class _Names:
    """A step's tensor names by module and call, and by role."""

    def __init__(self, results: dict[str, TensorResult]):
        self.call: dict[tuple[str, int, str], list[str]] = defaultdict(list)  # (module, call, role) -> names
        self.module: dict[tuple[str, str], list[str]] = defaultdict(list)  # (module, role) -> names, all calls
        for name in results:
            parsed = TensorName.parse(name)
            if parsed is None:
                continue
            if parsed.call is not None:
                self.call[parsed.module, parsed.call, parsed.role].append(name)
            self.module[parsed.module, parsed.role].append(name)

    def calls(self, module: str) -> list[str]:
        return [name for role in ("input", "output", "grad_output") for name in self.module[module, role]]


def _descendants(modules: list[ModuleInfo]) -> dict[str, set[str]]:
    parents = {module.name: module.parent for module in modules}
    found: dict[str, set[str]] = defaultdict(set)
    for name in parents:
        parent = parents[name]
        while parent is not None:
            found[parent].add(name)
            parent = parents.get(parent)
    return found


def _rule(parsed: TensorName | None, records: Sequence[_Record], before: tuple[list[int], int], names: _Names,
          equal: set[str], descendants: dict[str, set[str]], origins: dict[str, Origin],
          earlier_differs: bool) -> Rule | None:
    """Why this differing tensor is an origin (see the module's note), None when it is inherited."""
    if parsed is None or parsed.role in ("param", "input"):
        return None
    m = parsed.module
    if parsed.role == "output" and parsed.call is not None:
        sources = names.call[m, parsed.call, "input"] + names.module[m, "param"]  # none: made from no tensor
        if all(s in equal for s in sources) and not _child_origin(m, before, records, descendants, origins):
            return "inputs"
        return None
    if parsed.role == "grad":
        sources = names.module[m, "param"] + names.calls(m) + [n for d in descendants[m] for n in names.calls(d)]
        if names.module[m, "grad_output"] and all(s in equal for s in sources):
            return "backward"
        return None
    return None if earlier_differs else "first"


def _child_origin(module: str, before: tuple[list[int], int], records: Sequence[_Record], descendants: dict[str, set[str]],
                  origins: dict[str, Origin]) -> bool:
    """Whether a forward call of a submodule of `module` within its call just recorded has an origin among its
    tensors: the submodules' forward records right before it (a call's record is made when the call returns;
    the first other module's record marks where the call began). `before`: the execution order and this
    record's place in it."""
    order, position = before
    for index in reversed(range(position)):
        record = records[order[index]]
        if record.phase != "forward":
            continue
        if record.module not in descendants[module]:
            return False
        if any(result.name in origins and origins[result.name].origin for result in record.tensors):
            return True
    return False
