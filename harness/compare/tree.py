"""Comparison of two capture trees (harness.store.tree_format), step by step.

Steps are paired by position (a step one tree lacks is a failing "missing" finding). A tree of several
ranks (tensor parallel) has each step put together in the canonical (one-rank) layout first
(harness.store.ranks.assemble_step), its split tensors as the map's `shard:` declares them, every other
tensor a replica checked bit-identical across its ranks; two trees of one world size whose map declares no
shard are compared rank by rank instead. Each step's B dump is
put in A's names and layouts by the map (harness.capture.mapping `TensorMap.to_a`; without a map the
names must agree), then compared as any two dumps (harness.compare.case.compare_dumps; by default every
tensor is held bitwise). The result adds what a whole model needs: the records of A's execution order,
each with its tensors' results (shown forward, loss, backward, then parameters, gradients and the optimizer
step), the first divergent tensor with the module it belongs to (first in execution order:
tree_format.PHASE_ORDER, then record order) and each step's loss (harness.compare.step_loss); the steps
summed up as a trajectory are harness.compare.trajectory's. Each differing tensor is classed, once, as made by
its module (an origin) or handed on from an earlier difference (inherited): harness.compare.origins.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

from harness.case import ExpectSpec
from harness.compare.case import CaseComparison, TensorResult, compare_dumps
from harness.compare.expectations import Bitwise
from harness.compare.findings import Finding, Missing
from harness.compare.origins import Origin, classify
from harness.compare.pairs import OneSidedPair
from harness.compare.step_loss import StepLoss, step_loss
from harness.errors import UsageError
from harness.sharding import Sharding
from harness.store.dump import Dump
from harness.store.ranks import assemble_step
from harness.store.tree import Tree, TreeError, read_tree
from harness.store.tree_format import PHASE_ORDER, CaptureInfo, ModuleInfo, TensorName, rank_folder


class TensorMap(Protocol):
    """What comparing two trees asks of a map between their names (harness.capture.mapping.TensorMap)."""

    @property
    def is_identity(self) -> bool: ...

    def check_trees(self, tree_a: Tree, tree_b: Tree) -> None: ...

    def ignored(self, side: Literal["a", "b"], name: str) -> bool: ...

    def to_a(self, dump_b: Dump) -> Dump: ...

    @property
    def declares_sharding(self) -> bool: ...

    def sharding(self, side: Literal["a", "b"], name: str) -> Sharding | None: ...

    def module_pairs(self, modules_a: list[str], modules_b: list[str] | None = None) -> dict[str, list[str]]: ...


TREE_EXPECT = ExpectSpec(all=Bitwise())  # two captures of one model: every tensor bitwise, unless told otherwise
# the table's order (ties keep A's order): what ran, then the step's parameters, gradients and their update
TABLE_ORDER = {"forward": 0, "loss": 1, "backward": 2, "params": 3, "grads": 3, "optimizer": 4}
UNRECORDED = "(unrecorded)"  # the record of tensors that no record of A names (B-only names, say)


@dataclass
class RecordView:
    """One record of A's execution order (a module call's forward or backward, a module's parameters or
    gradients) with its tensors' results."""

    module: str
    type: str | None  # the module's class name, where A's capture lists the module
    call: int | None
    phase: str  # a tree_format Phase; "" for tensors no record names
    tensors: list[TensorResult]

    @property
    def bitwise(self) -> bool:
        return all(result.pair.bitwise for result in self.tensors)

    @property
    def holds(self) -> bool:
        return all(result.holds for result in self.tensors)


@dataclass
class Divergence:
    """Where two captures first differ: the step, the tensor, and the module (and its class) it belongs to."""

    step: str
    tensor: TensorResult
    module: str
    module_type: str | None
    phase: str

    @property
    def name(self) -> str:
        return self.tensor.name


@dataclass
class StepComparison:
    label: str  # the step folder, after its rank folder where there are ranks: "rank-00001/step-00000"
    comparison: CaseComparison  # its case_name is the label
    records: list[RecordView]  # in the table's order (TABLE_ORDER)
    modules: list[ModuleInfo]  # A's selected modules, in the model's order (the model tree)
    root: str  # A's model class
    divergence: Divergence | None  # the first tensor, in A's execution order, that is not bitwise equal
    sources: dict[str, list[str]] = field(default_factory=dict)  # A name -> the B tensors the map made it of
    left_out: dict[str, str] = field(default_factory=dict)  # A name -> why the map could not make it from B
    loss_a: StepLoss | None = None  # the loss each side recorded (None: neither `(train):loss.0` nor a 0-d output)
    loss_b: StepLoss | None = None
    origins: dict[str, Origin] = field(default_factory=dict)  # each differing tensor (both sides): origin or inherited

    @property
    def status(self) -> str:
        return self.comparison.status

    @property
    def inherited(self) -> int:
        """Differing tensors that only hand on an earlier difference."""
        return sum(not origin.origin for origin in self.origins.values())


@dataclass
class TreeSide:
    path: str
    side: str
    framework: str
    root: str
    mode: str
    steps: int
    ranks: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, tree: Tree) -> TreeSide:
        m = tree.manifest
        return cls(str(tree.path), m.side, m.framework, m.root, m.mode, len(m.steps), sorted(tree.ranks))


@dataclass
class TreeComparison:
    a: TreeSide
    b: TreeSide
    map: str | None  # the map file, None: names compared as they are
    steps: list[StepComparison]
    findings: list[Finding] = field(default_factory=list)  # steps or ranks one tree lacks (failing)
    tensor_map: TensorMap | None = None  # for the B modules of an A module the map made no tensor of

    @property
    def status(self) -> str:
        return "fail" if self.findings or any(step.status == "fail" for step in self.steps) else "pass"

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def divergence(self) -> Divergence | None:
        """The first divergent tensor of the first step that has one (of its first rank, where ranks are compared
        one by one: step by step, not rank by rank)."""
        order = {name: index for index, name in enumerate(dict.fromkeys(step_folder_of(s.label) for s in self.steps))}
        divergent = [step for step in self.steps if step.divergence is not None]
        first = min(divergent, key=lambda step: order[step_folder_of(step.label)], default=None)  # ties: the first rank
        return first.divergence if first else None

    @property
    def uncompared(self) -> int:
        """Tensors the map could not make from B's digests (a layout change needs the values): not compared."""
        return sum(len(step.left_out) for step in self.steps)

    @property
    def comparisons(self) -> list[CaseComparison]:
        return [step.comparison for step in self.steps]

    def refetch(self) -> dict[str, list[str]]:
        """Per side (by its name), the module globs whose tensors differ, or that the map could not make
        from B's digests: what a capture in mode "digests-then-full" should keep in full next time."""
        modules: dict[str, list[str]] = {"a": [], "b": []}
        for step in self.steps:
            for result in step.comparison.tensors:
                left_out = result.name in step.left_out
                if result.pair.bitwise or (isinstance(result.pair, OneSidedPair) and not left_out):
                    continue  # equal, or missing on one side: values would not help
                module = _module_of(result.name)
                sources = step.sources.get(result.name)
                others = [_module_of(source) for source in sources] if sources else self._b_modules(module)
                for side, found in (("a", [module]), ("b", others)):
                    modules[side] += [m for m in found if m and m not in modules[side]]
        a, b = ([glob.escape(m) for m in modules[side]] for side in ("a", "b"))
        if self.b.side == self.a.side:  # one list per side name: both sides share it
            return {self.a.side: list(dict.fromkeys(a + b))}
        return {self.a.side: a, self.b.side: b}

    def _b_modules(self, module: str) -> list[str]:
        if self.tensor_map is None or not module:
            return [module]
        return self.tensor_map.module_pairs([module]).get(module) or [module]


def step_folder_of(label: str) -> str:
    """A compared step's folder, without its rank folder: the step that several ranks' comparisons share."""
    return label.rpartition("/")[2]


def _module_of(name: str) -> str:
    parsed = TensorName.parse(name)
    return parsed.module if parsed else ""


def compare_trees(tree_a: str | Path | Tree, tree_b: str | Path | Tree, tensor_map: TensorMap | None = None,
                  expect: ExpectSpec | None = None, map_path: str | Path | None = None) -> TreeComparison:
    """Compare two capture trees step by step (see the module's note). `tensor_map`: B's names and
    layouts in A's (None: the names must agree); `expect`: what each tensor is held to (default bitwise)."""
    a = tree_a if isinstance(tree_a, Tree) else read_tree(tree_a)
    b = tree_b if isinstance(tree_b, Tree) else read_tree(tree_b)
    if tensor_map is not None:
        tensor_map.check_trees(a, b)
    named = tensor_map is None or tensor_map.is_identity  # B's names must be A's
    expect = expect or TREE_EXPECT
    findings: list[Finding] = []
    steps: list[StepComparison] = []
    for prefix, tree_ra, tree_rb in _rank_pairs(a, b, tensor_map):
        count = max(len(tree_ra.steps), len(tree_rb.steps))
        for index in range(count):
            names = (tree_ra.steps[index] if index < len(tree_ra.steps) else None,
                     tree_rb.steps[index] if index < len(tree_rb.steps) else None)
            label = prefix + (names[0] or names[1] or "")
            if names[0] is None or names[1] is None:
                findings.append(Finding(label, False, Missing(side="A" if names[0] is None else "B")))
                continue
            dump_a, dump_b = _step(tree_ra, index, "a", tensor_map), _step(tree_rb, index, "b", tensor_map)
            if named and not steps:
                _check_names_meet(a, b, label, dump_a, dump_b)
            left_out_a: dict[str, str] = dict(getattr(dump_a, "left_out", {}))
            if tensor_map is not None:
                dump_b = tensor_map.to_a(dump_b)
            ignored = None if tensor_map is None else (lambda name: tensor_map.ignored("a", name))
            steps.append(compare_steps(label, dump_a, dump_b, expect, ignored, left_out_a))
    return TreeComparison(TreeSide.of(a), TreeSide.of(b), None if map_path is None else str(map_path), steps,
                          findings, tensor_map)


def _check_names_meet(a: Tree, b: Tree, label: str, dump_a: Dump, dump_b: Dump) -> None:
    """UsageError, with the way to a map, when the first step pair shares no tensor name: compared as they are,
    every tensor would be on one side only."""
    names_a, names_b = dump_a.names, dump_b.names
    if names_a and names_b and not set(names_a) & set(names_b):
        raise UsageError(f"{a.path} and {b.path}: {label} shares no tensor name between the trees (A has {names_a[0]}, "
                         f"B {names_b[0]}): pair them with a map: xfalign map suggest {a.path} {b.path} -o map.yaml, "
                         "check it, then compare with --map map.yaml")


def _rank_pairs(a: Tree, b: Tree, tensor_map: TensorMap | None) -> list[tuple[str, Tree, Tree]]:
    """The trees to compare: rank by rank (the rank folder as prefix) where both trees have the same ranks
    and the map declares no shard; else ("", a, b), each step of a tree of several ranks assembled (_step)."""
    if a.ranks and b.ranks and a.ranks.keys() == b.ranks.keys() and not (tensor_map and tensor_map.declares_sharding):
        return [(rank_folder(rank) + "/", a.ranks[rank], b.ranks[rank]) for rank in sorted(a.ranks)]
    return [("", a, b)]


def _step(tree: Tree, index: int, side: Literal["a", "b"], tensor_map: TensorMap | None) -> Dump:
    """Step `index` of `tree`; of a tree of several ranks, put together in the canonical layout (the map's
    shards; every other tensor a replica)."""
    if not tree.ranks:
        return tree.step(index)
    name = tree.steps[index]
    short = [f"{rank_folder(rank)} has {len(rank_tree.steps)}" for rank, rank_tree in sorted(tree.ranks.items())
             if name not in rank_tree.steps]
    if short:
        raise TreeError(f"{tree.path}: {name} is not in every rank ({', '.join(short)} step(s)): a rank's capture "
                        "ended early")
    dumps = [tree.ranks[rank].step(name) for rank in sorted(tree.ranks)]
    return assemble_step(dumps, lambda tensor: None if tensor_map is None else tensor_map.sharding(side, tensor))


def compare_steps(label: str, dump_a: Dump, dump_b: Dump, expect: ExpectSpec | None = None,
                  ignored_a: Callable[[str], bool] | None = None,
                  left_out_a: dict[str, str] | None = None) -> StepComparison:
    """One step: the dumps compared (B already in A's names), then arranged by A's records. `ignored_a`:
    A tensors with no counterpart on purpose (the map's `ignore.a`), left out when B lacks them.
    `left_out_a`: A tensors its ranks' pieces could not make (why), as B's left out by the map."""
    comparison = compare_dumps(dump_a, dump_b, expect or TREE_EXPECT)
    comparison.case_name = label
    if ignored_a is not None:
        comparison.tensors = [result for result in comparison.tensors
                              if not (isinstance(result.pair, OneSidedPair) and result.pair.b is None
                                      and ignored_a(result.name))]
    left_out: dict[str, str] = {**getattr(dump_b, "left_out", {}), **(left_out_a or {})}  # a MappedDump's, an AssembledDump's
    for result in comparison.tensors:
        if result.name in left_out:  # "missing on side B" says why
            result.findings = [replace(f, data=f.data.model_copy(update={"reason": left_out[result.name]}))
                               if isinstance(f.data, Missing) else f for f in result.findings]
    info = _capture_info(dump_a)
    types = {module.name: module.type for module in info.modules} if info else {}
    results = {result.name: result for result in comparison.tensors}
    records: list[RecordView] = []  # in A's order
    placed: set[str] = set()
    for record in info.records if info else []:
        tensors = [results[name] for name in record.tensors if name in results and name not in placed]
        placed.update(result.name for result in tensors)
        view = RecordView(record.module, types.get(record.module), record.call, record.phase, tensors)
        records.append(view)
    rest = [result for result in comparison.tensors if result.name not in placed]
    if rest:
        records.append(RecordView(UNRECORDED, None, None, "", rest))
    table = sorted(records, key=lambda view: TABLE_ORDER.get(view.phase, len(TABLE_ORDER)))
    divergence = _first_divergence(label, records, types, set(left_out))
    modules = info.modules if info else []
    return StepComparison(label, comparison, table, modules, info.root if info else "",
                          divergence, dict(getattr(dump_b, "sources", {})), dict(left_out),
                          step_loss(dump_a), step_loss(dump_b), classify(records, modules, types, set(left_out)))


def _capture_info(dump: Dump) -> CaptureInfo | None:
    capture = dump.meta.get("capture")
    return None if capture is None else CaptureInfo.model_validate(capture)


def _first_divergence(label: str, records: list[RecordView], types: dict[str, str],
                      uncompared: set[str]) -> Divergence | None:
    """The first tensor, in execution order (tree_format.PHASE_ORDER, then A's record order within a phase:
    parameters at the step's start, forward, loss, backward, gradients, the optimizer step), that both sides
    recorded and that is not bitwise equal; else the first that one side lacks. A tensor the map could not make
    from B's digests (`uncompared`) is not a divergence."""
    ordered = sorted(records, key=lambda view: PHASE_ORDER.get(view.phase, len(PHASE_ORDER)))  # unrecorded last
    execution = [(view, result) for view in ordered for result in view.tensors if result.name not in uncompared]
    for wanted in (lambda r: not isinstance(r.pair, OneSidedPair), lambda r: True):
        for view, result in execution:
            if not result.pair.bitwise and wanted(result):
                module = view.module
                if module == UNRECORDED:
                    parsed = TensorName.parse(result.name)
                    module = parsed.module if parsed else ""
                return Divergence(label, result, module, types.get(module), view.phase)
    return None
