"""Terminal report: one rich table row per tensor and a one-line verdict per case."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.case import describe_expectation
from harness.compare import CaseComparison, SideInfo, failure_text
from harness.gate import GateResult


def _side_line(label: str, side: SideInfo) -> str:
    env = side.environment
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "megatron_core", "paddle") if env.get(k))
    mode = f" ({side.mode})" if side.mode else ""
    return escape(f"{label} {side.name}: {side.impl}{mode} on {env.get('device_name') or env.get('device')}; {versions}") + f"\n    {escape(side.provenance)}"


def comparison_table(comparison: CaseComparison) -> Table:
    table = Table(title=escape(comparison.case_name), title_justify="left")
    for column, justify in [("tensor", "left"), ("shape", "left"), ("dtype", "left"), ("md5 A", "left"),
                            ("md5 B", "left"), ("bitwise", "center"), ("differing", "right"),
                            ("max ULP", "right"), ("max abs", "right"), ("expect", "left"), ("holds", "center")]:
        table.add_column(column, justify=justify)
    for pair in comparison.pairs:
        digest = pair.a or pair.b
        stats = pair.stats
        table.add_row(
            pair.name,
            str(list(digest.shape)) + ("*" if pair.findings else ""),
            digest.dtype if not (pair.a and pair.b and pair.a.dtype != pair.b.dtype) else f"{pair.a.dtype}/{pair.b.dtype}",
            pair.a.md5[:8] if pair.a else "-",
            pair.b.md5[:8] if pair.b else "-",
            "[green]yes[/]" if pair.bitwise else "[red]no[/]",
            f"{stats.differing:,}" if stats else "-",
            str(stats.max_ulp) if stats else "-",
            f"{stats.max_abs:.3g}" if stats else "-",
            describe_expectation(pair.expectation),
            "[green]yes[/]" if pair.holds else "[bold red]NO[/]",
        )
    return table


def verdict_line(comparison: CaseComparison) -> str:
    if comparison.unavailable:
        return f"[bold yellow]N/A[/] {escape(comparison.case_name)}: not available here: {escape(comparison.unavailable)}"
    bitwise = sum(pair.bitwise for pair in comparison.pairs)
    summary = f"{len(comparison.pairs)} tensors, {bitwise} bitwise equal"
    if comparison.passed:
        return f"[bold green]PASS[/] {escape(comparison.case_name)}: {summary}; every expectation holds"
    return f"[bold red]FAIL[/] {escape(comparison.case_name)}: {summary}; " + escape("; ".join(failure_text(p) for p in comparison.failing))


def print_comparison(comparison: CaseComparison, console: Console) -> None:
    console.print(_side_line("A", comparison.a))
    console.print(_side_line("B", comparison.b))
    console.print(comparison_table(comparison))
    for side in (comparison.a, comparison.b):
        for name, distinct in side.nondeterministic.items():
            console.print(f"  ! {name} is nondeterministic on side {side.name}: {distinct} different digests over the repeats",
                          highlight=False, markup=False)
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
