"""The CI gate: goldens per case (harness.store.golden), drift against them, nondeterminism, cross-framework
expectations.

The gate's results are Findings (harness.compare.findings): the failing expectations, drift against the
golden, changed inputs, nondeterminism, a missing golden; changed fingerprint fields ride along, passing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from harness.compare.findings import (
    GOLDEN,
    EnvironmentChanged,
    Finding,
    InputChanged,
    NoGolden,
    Nondeterministic,
    OtherGenerator,
    judged,
)
from harness.compare.pairs import DigestPair, originate
from harness.compare.tree import StepComparison, TreeComparison, TreeSide, compare_steps
from harness.errors import XfalignError
from harness.fingerprint import changed_fields
from harness.golden_policy import GoldenPolicy, GoldenUpdate
from harness.runner import CaseRun, critical
from harness.store.digest import Digest
from harness.store.dump import Dump, DumpError
from harness.store.golden import TREE_GOLDEN_HEADER, Golden, GoldenMismatch, remove_obtained
from harness.store.tree import Tree
from harness.store.tree_format import TensorName


@dataclass
class GateResult:
    case_name: str
    findings: list[Finding] = field(default_factory=list)  # failing ones fail the gate; environment ones explain drift
    unreadable: XfalignError | None = None  # why its golden could not be read (then it was not checked)
    written: Path | None = None  # the golden written now (missing, or rewritten by the policy)
    update: GoldenUpdate | None = None  # what writing it changed
    obtained: Path | None = None  # what the run produced, written beside a golden it drifted from
    golden_environment: dict[str, dict] | None = None  # side -> its fingerprint in the golden checked against

    @classmethod
    def of_unreadable(cls, case_name: str, error: XfalignError):
        """The verdict of a case (or step) whose golden cannot be read: it fails, the others go on."""
        return cls(case_name, [Finding("", False, NoGolden(unreadable=str(error)))], unreadable=error)

    @property
    def failures(self) -> list[Finding]:
        return [finding for finding in self.findings if not finding.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def drifted(self) -> bool:
        """Whether the run's tensors or inputs differ from the golden."""
        return any(f.expected == GOLDEN or isinstance(f.data, InputChanged | OtherGenerator) for f in self.failures)

    @property
    def golden_problems(self) -> bool:
        """Whether rewriting the golden would change what it says (`--update --only-failing`)."""
        return self.drifted or any(isinstance(f.data, NoGolden) for f in self.failures)

    @property
    def inputs_changed(self) -> bool:
        """Whether the run's inputs differ from the golden's: the golden belongs to another case (or this case's
        inputs changed), which explains its drift better than the code or the environment can."""
        return any(isinstance(f.data, InputChanged) for f in self.failures)

    @property
    def environment_changes(self) -> list[Finding]:
        """The fingerprint fields that changed since the golden (found only where the run drifted)."""
        return [f for f in self.findings if isinstance(f.data, EnvironmentChanged)]


def _environment_findings(golden: Golden, current: Golden) -> list[Finding]:
    """Every fingerprint field that differs from the golden's (a field only one recorded counts)."""
    findings = []
    for side, now in current.environment.items():
        before = golden.environment.get(side, {})
        findings += [Finding(side, True, EnvironmentChanged(field=name, golden=before.get(name), now=now.get(name)))
                     for name in changed_fields(before, now)]
    return findings


def _drift(side: str, name: str, old: Digest | None, new: Digest | None, golden: Golden,
           now: Mapping[str, np.ndarray]) -> list[Finding]:
    """How tensor `name` of `side` drifted from the golden; `now`: the side's tensors (values, where kept)."""
    if old == new:
        return []
    where = f"{side}/{name}"
    if old is not None and new is not None and (golden.arrays is None or where not in golden.arrays):
        return judged(DigestPair(where, old, new, digests_only=()).compare(), False, GOLDEN)
    pair = originate(where, golden.arrays.get(where) if golden.arrays else None, now.get(name), (old, new))
    return judged(pair.compare(), False, GOLDEN)


def check(run: CaseRun, golden: Golden | None) -> GateResult:
    result = GateResult(run.case_name)
    for side, dump in run.dumps.items():
        for name, distinct in dump.nondeterministic.items():
            result.findings.append(Finding(f"{side}/{name}", False, Nondeterministic(
                side=side, distinct=distinct, repeats=len(dump.meta["repeats"][name]))))
    unstable = {name for dump in run.dumps.values() for name in dump.nondeterministic}
    for tensor in run.comparison.failing if run.comparison else []:  # a gate runs both sides
        if tensor.name not in unstable:  # nondeterministic on one side: not blamed on the other
            result.findings += tensor.failures
    if golden is None:
        result.findings.append(Finding("", False, NoGolden()))
        return result
    result.golden_environment = golden.environment
    current = Golden.from_run(run)
    if golden.generator != current.generator:  # every input differs by design: one finding, not one per tensor
        result.findings.append(Finding("", False, OtherGenerator(golden=golden.generator, now=current.generator)))
        return result
    for name in golden.inputs.keys() | current.inputs.keys():
        if golden.inputs.get(name) != current.inputs.get(name):
            result.findings.append(Finding(name, False, InputChanged(
                golden=golden.inputs[name].to_json() if name in golden.inputs else None,
                now=current.inputs[name].to_json() if name in current.inputs else None)))
    for side in current.tensors:
        old, new = golden.tensors.get(side, {}), current.tensors[side]
        for name in list(new) + [n for n in old if n not in new]:
            result.findings += _drift(side, name, old.get(name), new.get(name), golden, run.dumps[side].tensors)
    if result.drifted:
        result.findings += _environment_findings(golden, current)
    return result


def write_golden(golden: Golden, directory: Path, written: list[str], with_arrays: bool = True) -> Path:
    """Write the golden and add its case to `written`, as one: SIGINT or SIGTERM meanwhile takes effect after
    both, so an interrupted update says exactly which goldens it wrote, and leaves no staging file."""
    with critical():
        path = golden.write(directory, with_arrays)
        written.append(golden.case)
    return path


def golden_problem(directory: Path, case_name: str) -> XfalignError | None:
    """Why the case's golden cannot be read (None: it reads, or there is none yet): asked before any side runs."""
    try:
        Golden.read(directory, case_name)
    except (DumpError, GoldenMismatch) as error:
        return error
    return None


def describe_update(old: Golden | None, new: Golden) -> GoldenUpdate:
    """What an update changed."""
    if old is None:
        return GoldenUpdate(True)
    return GoldenUpdate(
        False,
        [f"{side}/{name}" for side, tensors in new.tensors.items()
         for name, digest in tensors.items() if old.tensors.get(side, {}).get(name) != digest],
        [name for name, digest in new.inputs.items() if old.inputs.get(name) != digest],
        _environment_findings(old, new))


R = TypeVar("R", bound=GateResult)


def settle(policy: GoldenPolicy, folder: Path, name: str, golden: Golden | None, current: Golden,
           judge: Callable[[Golden | None], R], written: list[str], with_arrays: bool = True) -> R:
    """A case (or tree step) against its golden under `policy`: `judge` checks the run against a golden (None:
    there is none); `current` is the golden the run makes. The one rule of the CLI, trees and pytest: a golden is
    written when the policy says so (GoldenPolicy.writes); a missing one written by write-missing fails once,
    saying so; one rewritten by force-regen or regen-all is checked again. A drift left in place leaves
    `<stem>.golden.obtained.yaml` beside the golden; a pass (or a rewrite) removes it."""
    result = judge(golden)
    if policy.writes(golden is None, result.golden_problems):
        path = write_golden(current, folder, written, with_arrays)
        update = describe_update(golden, current)
        if policy.passes_written:
            result = judge(Golden.read(folder, name) or current)
        else:  # a missing golden, written: it fails once, saying where it was written
            result.findings = [replace(f, data=f.data.model_copy(update={"written": str(path)}))
                               if isinstance(f.data, NoGolden) else f for f in result.findings]
        result.written, result.update = path, update
    elif result.drifted:
        result.obtained = current.write_obtained(folder)
    elif golden is not None:
        remove_obtained(folder, name)
    return result


# -- capture trees -------------------------------------------------------------------------------------
# A tree's golden is one golden per step (this module's format, digests only, `values: null`), named
# `<side>.<step>` (`<side>.rank-00001_step-00000` with ranks) in the baseline folder itself: the tensors'
# digests, in execution order, and the fingerprint recorded by the capture. A missing golden is written and
# the step fails once; `update` rewrites them all. For the reports, each step is also compared with its
# golden as two capture steps are (A: the golden, B: the step now).

GOLDEN_SIDE = "golden"  # side A's name in a tree gate's reports


@dataclass
class TreeGateResult(GateResult):
    step: StepComparison | None = None  # the step against its golden, for the reports (None: no golden read)

    @property
    def first_drift(self) -> tuple[str, str | None] | None:
        """The first tensor (in execution order) that drifted from the golden, and its module."""
        finding = next((f for f in self.failures if f.expected == GOLDEN), None)
        if finding is None:
            return None
        parsed = TensorName.parse(finding.tensor.split("/", 1)[-1])
        return finding.tensor, parsed.module if parsed else None


def _step_golden(name: str, dump: Dump) -> Golden:
    side = dump.side
    return Golden(name, {}, {side: dict(dump.meta["environment"])}, {side: dump.digests}, None, TREE_GOLDEN_HEADER,
                  generator=None)


def check_step(name: str, dump: Dump, golden: Golden) -> TreeGateResult:
    """Drift of one step's digests from its golden (every tensor, in execution order)."""
    result = TreeGateResult(name, golden_environment=golden.environment)
    current = _step_golden(name, dump)
    for side, new in current.tensors.items():
        old = golden.tensors.get(side, {})
        for tensor in list(new) + [n for n in old if n not in new]:
            result.findings += _drift(side, tensor, old.get(tensor), new.get(tensor), golden, dump.tensors)
    if result.drifted:
        result.findings += _environment_findings(golden, current)
    return result


def _golden_dump(golden: Golden, dump: Dump) -> Dump:
    """The golden of a step as a digest-only dump of it, with the step's own record of what ran (its order)."""
    meta = {key: value for key, value in dump.meta.items() if key != "tensors"}
    digests = golden.tensors.get(dump.side, {})
    return Dump(dict(meta, environment=golden.environment.get(dump.side, {})), {},
                unstored={name: digest.to_json() for name, digest in digests.items()}, order=list(digests))


@dataclass
class _Step:
    name: str  # its golden's name: <side>.<step>, <side>.rank-00001/<step>
    label: str  # as tree comparisons name it: <step>, rank-00001/<step>
    tree: Tree  # the tree (of its rank) that holds it
    step: str


def _steps(tree: Tree) -> list[_Step]:
    units = [(f"{rank_tree.path.name}/", rank_tree) for _, rank_tree in sorted(tree.ranks.items())] or [("", tree)]
    return [_Step(f"{unit.manifest.side}.{prefix}{step}", prefix + step, unit, step)
            for prefix, unit in units for step in unit.steps]


def gate_tree(tree: Tree, baseline: str | Path, policy: GoldenPolicy | bool = GoldenPolicy.WRITE_MISSING,
              written: list[str] | None = None) -> Iterator[TreeGateResult]:
    """Every step of the capture tree (every rank's) against its golden in `baseline`, each as it is done, under
    `policy` (settle; True: regen-all, as `update=True` was). Each golden written is added to `written` as it is
    written: an interrupted update knows which it wrote. A golden that cannot be read fails its step (force-regen
    and regen-all rewrite it); the other steps go on."""
    if isinstance(policy, bool):
        policy = GoldenPolicy.REGEN_ALL if policy else GoldenPolicy.WRITE_MISSING
    baseline, written = Path(baseline), [] if written is None else written
    for unit in _steps(tree):
        dump = unit.tree.step(unit.step)
        try:
            golden = Golden.read(baseline, unit.name)
        except (DumpError, GoldenMismatch) as error:
            if not policy.rewrites_unreadable or isinstance(error, GoldenMismatch):  # another's: never overwritten
                yield TreeGateResult.of_unreadable(unit.name, error)
                continue
            golden = None  # unreadable: rewritten

        def judge(against: Golden | None, unit: _Step = unit, dump: Dump = dump) -> TreeGateResult:
            if against is None:
                return TreeGateResult(unit.name, [Finding("", False, NoGolden())])
            return check_step(unit.name, dump, against)

        new = _step_golden(unit.name, dump)
        result = settle(policy, baseline, unit.name, golden, new, judge, written, with_arrays=False)
        shown = new if result.written is not None else golden
        if shown is not None:
            result.step = compare_steps(unit.label, _golden_dump(shown, dump), dump)
        yield result


def tree_gate_steps(tree: Tree) -> list[str]:
    """The goldens' names of a tree's steps, in the order gate_tree goes through them."""
    return [unit.name for unit in _steps(tree)]


def tree_gate_comparison(tree: Tree, baseline: Path, results: list[TreeGateResult]) -> TreeComparison:
    """The tree against its goldens as a comparison of two trees (A: the goldens, B: the tree now), for the
    JSON and HTML reports; a step whose golden was missing or unreadable is a finding."""
    now = TreeSide.of(tree)
    goldens = replace(now, path=str(baseline), side=GOLDEN_SIDE, mode="digest")
    findings = [replace(finding, tensor=result.case_name) for result in results
                for finding in result.failures if isinstance(finding.data, NoGolden)]
    return TreeComparison(goldens, now, None, [result.step for result in results if result.step is not None], findings)
