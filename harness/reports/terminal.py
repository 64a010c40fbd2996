"""Terminal report: one rich table row per tensor and a one-line verdict per case (words from text.py)."""

from __future__ import annotations

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from harness.compare.case import CaseComparison, SideInfo
from harness.compare.findings import STRUCTURAL, NoGolden, NotApplicable
from harness.compare.trajectory import StepSummary, Trajectory, trajectory_of
from harness.compare.tree import StepComparison, TreeComparison
from harness.gate import GateResult, TreeGateResult
from harness.reports.text import (
    CODE_CHANGED,
    GATE_LABELS,
    INPUTS_CHANGED,
    TABLE_COLUMNS,
    TRAJECTORY_COLUMNS,
    TREE_COLUMNS,
    abs_text,
    all_steps_hint_text,
    call_text,
    classes_text,
    closer_text,
    differing_count_text,
    differing_text,
    divergence_text,
    dtype_text,
    environment_changed_text,
    expectation_text,
    findings_lines,
    first_drift_text,
    gate_lines,
    gate_pass_text,
    golden_update_text,
    hash_text,
    kind_text,
    loss_text,
    map_text,
    more_lines_text,
    nondeterministic_text,
    note_text,
    obtained_text,
    origins_text,
    phase_text,
    reference_text,
    side_dumped_text,
    side_text,
    side_unavailable_text,
    slot_text,
    status_label,
    step_divergence_text,
    step_summary_text,
    tensor_mark_text,
    to_exact_text,
    trajectory_text,
    tree_gate_pass_text,
    tree_side_text,
    tree_verdict_text,
    ulp_text,
    verdict_text,
    yes_no,
)
from harness.store.dump import Dump

STATUS_STYLES = {"pass": "bold green", "fail": "bold red", "n/a": "bold yellow"}
# per column of TABLE_COLUMNS
_JUSTIFY: tuple[JustifyMethod, ...] = ("left",) * 5 + ("center",) + ("right",) * 4 + ("left",) * 3 + ("center",)
MAX_FAILURE_LINES = 20  # per step: a divergence early in a model makes every later tensor fail
LISTED = (*STRUCTURAL, NotApplicable)  # findings listed under the table (the structural ones marked in it)


def _plain(console: Console, line: str) -> None:
    console.print(line, highlight=False, markup=False)


def _side_line(label: str, side: SideInfo) -> str:
    line = escape(side_text(label, side))
    could_not_run = side.provenance == "-"
    return line + ("" if could_not_run else f"\n    {escape(side.provenance)}")


def comparison_table(comparison: CaseComparison) -> Table:
    table = Table(title=escape(comparison.case_name), title_justify="left")
    for column, justify in zip(TABLE_COLUMNS, _JUSTIFY, strict=True):
        table.add_column(column, justify=justify)
    for result in comparison.tensors:
        pair = result.pair
        structural = any(isinstance(f.data, STRUCTURAL) for f in result.findings)  # the shape cell is marked
        cells = [  # plain text: names and shapes are never read as rich markup
            pair.name,
            str(list(pair.digest.shape)) + ("*" if structural else ""),
            dtype_text(pair),
            hash_text(pair.a),
            hash_text(pair.b),
            Text(yes_no(pair.bitwise), "green" if pair.bitwise else "red"),
            differing_text(pair),
            classes_text(pair),
            ulp_text(pair),
            abs_text(pair),
            to_exact_text(pair),
            closer_text(pair),
            expectation_text(result),
            Text(yes_no(result.holds, "NO"), "green" if result.holds else "bold red"),
        ]
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in cells))
    return table


def verdict_line(comparison: CaseComparison) -> str:
    """The verdict as rich markup: the label styled, the rest escaped."""
    status = comparison.status
    return f"[{STATUS_STYLES[status]}]{status_label(status)}[/] {escape(verdict_text(comparison))}"


def print_nondeterministic(side: str, nondeterministic: dict[str, int], console: Console) -> None:
    """One line per tensor whose digest varied over the repeats of one side."""
    for name, distinct in nondeterministic.items():
        _plain(console, f"  ! {nondeterministic_text(side, name, distinct)}")


def print_side_dump(case_name: str, side: str, dump: Dump, path, console: Console) -> None:
    """What one side run alone (`run --side`) produced: where, whether it could run, what varied over repeats."""
    if "unavailable" in dump.meta:
        _plain(console, side_unavailable_text(case_name, side, dump.meta["unavailable"]))
    _plain(console, side_dumped_text(case_name, side, len(dump.tensors), path))
    print_nondeterministic(side, dump.nondeterministic, console)


def print_comparison(comparison: CaseComparison, console: Console) -> None:
    console.print(_side_line("A", comparison.a))
    console.print(_side_line("B", comparison.b))
    if comparison.status != "n/a":
        _plain(console, reference_text(comparison))
    if comparison.status != "n/a":
        console.print(comparison_table(comparison))
    for side in (comparison.a, comparison.b):
        print_nondeterministic(side.name, side.nondeterministic, console)
    for result in comparison.tensors:
        for line in findings_lines([f for f in result.findings if isinstance(f.data, LISTED)]):
            _plain(console, f"  * {line}")
        if result.pair.note:
            _plain(console, f"  note: {note_text(result.name, result.pair.note)}")
    console.print(verdict_line(comparison))


def print_gate_result(result: GateResult, console: Console) -> None:
    if result.passed:
        console.print(f"[{STATUS_STYLES['pass']}]{GATE_LABELS[True]}[/] {escape(gate_pass_text(result.case_name))}")
        return
    console.print(f"[{STATUS_STYLES['fail']}]{GATE_LABELS[False]}[/] {escape(result.case_name)}:")
    for line in gate_lines(result.failures):
        _plain(console, f"  {line}")
    _print_cause(result, console)


def _print_cause(result: GateResult, console: Console) -> None:
    """What explains the drift: inputs that are not the golden's, a changed environment, else the code."""
    if result.inputs_changed:
        _plain(console, f"  {INPUTS_CHANGED}")
    elif result.environment_changes:
        _plain(console, f"  {environment_changed_text(result.environment_changes)}")
    elif result.drifted:
        _plain(console, f"  {CODE_CHANGED}")
    if result.obtained is not None:
        _plain(console, f"  {obtained_text(result.case_name, result.obtained)}")


_TREE_JUSTIFY: tuple[JustifyMethod, ...] = ("left", "right", "left", "left", "left", "left", "left", "left", "center",
                                            "right", "right", "left", "center")  # per column of TREE_COLUMNS


def step_table(step: StepComparison) -> Table:
    """One row per tensor, grouped by A's records (forward, backward, then parameters and gradients); the
    module, call and phase are named on a record's first row."""
    table = Table(title=escape(step_summary_text(step)), title_justify="left")
    for column, justify in zip(TREE_COLUMNS, _TREE_JUSTIFY, strict=True):
        table.add_column(column, justify=justify)
    first = step.divergence.name if step.divergence else None
    for view in step.records:
        for index, result in enumerate(view.tensors):
            pair = result.pair
            head = (view.module, call_text(view.call), phase_text(view.phase)) if index == 0 else ("", "", "")
            name = slot_text(pair.name, view.module) + tensor_mark_text(pair.name == first, step.origins.get(pair.name))
            cells = [*head, Text(name, "bold red" if pair.name == first else ""),
                     str(list(pair.digest.shape)), dtype_text(pair),
                     hash_text(pair.a), hash_text(pair.b),
                     Text(yes_no(pair.bitwise), "green" if pair.bitwise else "red"), ulp_text(pair), abs_text(pair),
                     expectation_text(result), Text(yes_no(result.holds, "NO"), "green" if result.holds else "bold red")]
            table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in cells),
                          end_section=index == len(view.tensors) - 1)
    return table


KIND_STYLES = {"equal": "green", "input-differs": "yellow", "diverges": "bold red", "inherits": "red"}


def trajectory_table(trajectory: Trajectory) -> Table:
    """One row per step: both losses, the tensors that differ, its kind, its first divergent tensor."""
    table = Table()
    for column in TRAJECTORY_COLUMNS:
        table.add_column(column, justify="right" if column == "differing" else "left")
    for step in trajectory.steps:
        a, b = step.loss_a, step.loss_b
        loss_differs = a is not None and b is not None and a.digest != b.digest
        table.add_row(Text(step.label), Text(loss_text(a)), Text(loss_text(b), "red" if loss_differs else ""),
                      Text(differing_count_text(step)), Text(kind_text(step, trajectory), KIND_STYLES[step.kind]),
                      Text(step_divergence_text(step)))
    return table


def _print_step(step: StepComparison, console: Console) -> None:
    console.print(step_table(step))
    origins = origins_text(step)
    if origins:
        _plain(console, f"  {origins}")
    lines = findings_lines([finding for result in step.comparison.failing for finding in result.failures])
    for line in lines[:MAX_FAILURE_LINES]:
        _plain(console, f"  * {line}")
    if len(lines) > MAX_FAILURE_LINES:
        _plain(console, f"  * {more_lines_text(len(lines) - MAX_FAILURE_LINES)}")


def _shown_steps(trajectory: Trajectory, steps: str) -> list[StepSummary]:
    if steps == "all" or len(trajectory.steps) == 1:
        return trajectory.steps
    first = trajectory.first_divergent
    return [first] if first else []


def print_tree_comparison(tree: TreeComparison, console: Console, steps: str = "first") -> None:
    """Both trees, the map, then (several steps) the per-step summary and the table of the first divergent step
    only (`steps="all"`: of every step), or (one step) its table; the failures under each table, the verdict
    and the first divergence."""
    _plain(console, tree_side_text("A", tree.a))
    _plain(console, tree_side_text("B", tree.b))
    _plain(console, map_text(tree.map))
    trajectory = trajectory_of(tree.steps)
    if len(trajectory.steps) > 1:
        _plain(console, trajectory_text(trajectory))
        console.print(trajectory_table(trajectory))
    for summary in _shown_steps(trajectory, steps):
        for step in summary.steps:
            _print_step(step, console)
    if len(trajectory.steps) > 1 and steps != "all":
        _plain(console, f"  {all_steps_hint_text()}")
    status = tree.status
    console.print(f"[{STATUS_STYLES[status]}]{status_label(status)}[/] {escape(tree_verdict_text(tree))}")
    _plain(console, f"  {divergence_text(tree.divergence, tree.uncompared)}")


def print_tree_gate_result(result: TreeGateResult, console: Console) -> None:
    """One capture step against its golden: written or updated, passing, or what drifted (the first named)."""
    created = any(isinstance(finding.data, NoGolden) for finding in result.failures)  # the failure says it was written
    if result.update is not None and not created:
        _plain(console, golden_update_text(result.case_name, result.update, result.written))
    if result.passed:
        console.print(f"[{STATUS_STYLES['pass']}]{GATE_LABELS[True]}[/] {escape(tree_gate_pass_text(result.case_name))}")
        return
    console.print(f"[{STATUS_STYLES['fail']}]{GATE_LABELS[False]}[/] {escape(result.case_name)}:")
    first = result.first_drift
    if first is not None:
        _plain(console, f"  {first_drift_text(*first)}")
    lines = gate_lines(result.failures)
    for line in lines[:MAX_FAILURE_LINES]:
        _plain(console, f"  {line}")
    if len(lines) > MAX_FAILURE_LINES:
        _plain(console, f"  {more_lines_text(len(lines) - MAX_FAILURE_LINES)}")
    _print_cause(result, console)
