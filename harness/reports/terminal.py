"""Terminal report: one rich table row per tensor and a one-line verdict per case."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from harness.compare import CaseComparison, SideInfo
from harness.gate import GateResult
from harness.dump import Dump
from harness.reports.text import (abs_text, classes_text, expectation_text, nondeterministic_text, side_dumped_text,
                                  side_unavailable_text, status_label, ulp_text, verdict_text)

STATUS_STYLES = {"pass": "bold green", "fail": "bold red", "n/a": "bold yellow"}


def _side_line(label: str, side: SideInfo) -> str:
    env = side.environment
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "megatron_core", "paddle") if env.get(k))
    mode = f" ({side.mode})" if side.mode else ""
    device = env.get("device_name") or env.get("device")
    where = f" on {device}" if device else ""  # a side that could not run records no environment
    line = escape(f"{label} {side.name}: {side.impl}{mode}{where}" + (f"; {versions}" if versions else ""))
    return line + (f"\n    {escape(side.provenance)}" if side.provenance != "-" else "")


def comparison_table(comparison: CaseComparison) -> Table:
    table = Table(title=escape(comparison.case_name), title_justify="left")
    for column, justify in [("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("md5 A", "left"),
                            ("md5 B", "left"), ("bitwise", "center"), ("differing", "right"), ("NaN/Inf", "right"),
                            ("max ULP", "right"), ("max abs", "right"), ("expect", "left"), ("holds", "center")]:
        table.add_column(column, justify=justify)
    for pair in comparison.pairs:
        digest = pair.a or pair.b
        stats = pair.stats
        cells = [  # plain text: names and shapes are never read as rich markup
            pair.name,
            str(list(digest.shape)) + ("*" if pair.findings else ""),
            digest.dtype if not (pair.a and pair.b and pair.a.dtype != pair.b.dtype) else f"{pair.a.dtype}/{pair.b.dtype}",
            pair.a.md5[:8] if pair.a else "-",
            pair.b.md5[:8] if pair.b else "-",
            Text("yes", "green") if pair.bitwise else Text("no", "red"),
            f"{stats.differing:,}" if stats else "-",
            classes_text(pair),
            ulp_text(pair),
            abs_text(pair),
            expectation_text(pair),
            Text("yes", "green") if pair.holds else Text("NO", "bold red"),
        ]
        table.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in cells))
    return table


def verdict_line(comparison: CaseComparison) -> str:
    """The verdict as rich markup: the label styled, the rest escaped."""
    status = comparison.status
    return f"[{STATUS_STYLES[status]}]{status_label(status)}[/] {escape(verdict_text(comparison))}"


def print_nondeterministic(side: str, nondeterministic: dict[str, int], console: Console) -> None:
    """One line per tensor whose digest varied over the repeats of one side."""
    for name, distinct in nondeterministic.items():
        console.print(f"  ! {nondeterministic_text(side, name, distinct)}", highlight=False, markup=False)


def print_side_dump(case_id: str, side: str, dump: Dump, path, console: Console) -> None:
    """What one side run alone (`run --side`) produced: where, whether it could run, what varied over repeats."""
    if "unavailable" in dump.meta:
        console.print(side_unavailable_text(case_id, side, dump.meta["unavailable"]), highlight=False, markup=False)
    console.print(side_dumped_text(case_id, side, len(dump.tensors), path), highlight=False, markup=False)
    print_nondeterministic(side, dump.nondeterministic, console)


def print_comparison(comparison: CaseComparison, console: Console) -> None:
    console.print(_side_line("A", comparison.a))
    console.print(_side_line("B", comparison.b))
    if comparison.status != "n/a":
        console.print(comparison_table(comparison))
    for side in (comparison.a, comparison.b):
        print_nondeterministic(side.name, side.nondeterministic, console)
    for pair in comparison.pairs:
        if pair.findings:
            console.print(f"  * {pair.name}: " + "; ".join(pair.findings), highlight=False, markup=False)
        if pair.note:
            console.print(f"  note: {pair.name} {pair.note}", highlight=False, markup=False)
    console.print(verdict_line(comparison))


def print_gate_result(result: GateResult, console: Console) -> None:
    if result.passed:
        console.print(f"[bold green]GATE PASS[/] {escape(result.case_id)}: expectations hold, digests match the golden")
        return
    console.print(f"[bold red]GATE FAIL[/] {escape(result.case_id)}:")
    for problem in result.problems:
        console.print(f"  [{problem.kind}] {problem.text}", highlight=False, markup=False)
    if result.environment_changes:
        console.print("  environment changed since the golden: " + "; ".join(result.environment_changes),
                      highlight=False, markup=False)
    elif result.drifted:
        console.print("  environment fingerprint unchanged since the golden: the code changed", highlight=False)
