"""xfalign command line.

Exit codes: 0 every expectation holds, 1 a check failed, 2 bad input or usage, 3 a side crashed or
timed out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from harness.case import CaseError, load_cases
from harness.compare import InputMismatch, compare_dumps
from harness.dump import Dump, DumpError
from harness.gate import Golden, baseline_dir, check, describe_update, missing_class_message
from harness.numerics import ProfileError
from harness.reports.html import write_reports
from harness.reports.json_report import write_json
from harness.reports.terminal import print_comparison, print_gate_result, print_side_dump
from harness.runner import SideFailed, class_of, run_case

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_SIDE_CRASHED = 0, 1, 2, 3
DEFAULT_HTML = Path("reports")


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xfalign", description="Compare Paddle and Megatron-Core tensors, bit for bit.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run cases (both sides, or one with --side) and compare")
    run.add_argument("cases", nargs="+", type=Path, help="YAML case files")
    run.add_argument("--side", help="run only this side (needs --dump)")
    run.add_argument("--dump", type=Path, help="write dumps here: DIR/<side> (DIR/<case>/<side> for several cases), or DIR itself with --side")
    run.add_argument("--repeat", type=int, default=1, help="run each side N times; report digests that vary")
    run.add_argument("--numerics", metavar="PROFILE", help="numerics profile for every case (configs/numerics/NAME.yaml or a path); default: the case's, else portable-avx2")
    run.add_argument("--json", type=Path, help="write the full comparison as JSON")
    run.add_argument("--html", type=Path, default=DEFAULT_HTML, help="HTML report: a .html file, or a folder (default: reports/)")
    gate = commands.add_parser("gate", help="CI gate: expectations, goldens, determinism")
    gate.add_argument("cases", nargs="+", type=Path, help="YAML case files")
    gate.add_argument("--baseline", type=Path, required=True,
                      help="folder of goldens: DIR/<environment class>/ (or DIR itself when it holds goldens)")
    gate.add_argument("--numerics", metavar="PROFILE", help="numerics profile for every case (configs/numerics/NAME.yaml or a path); default: the case's, else portable-avx2")
    gate.add_argument("--update", action="store_true", help="(re)write goldens")
    gate.add_argument("--only-failing", action="store_true", help="with --update: only goldens that do not match")
    gate.add_argument("--repeat", type=int, default=1, help="run each side N times to detect nondeterminism")
    gate.add_argument("--digests-only", action="store_true", help="with --update: store digests, not tensor values")
    gate.add_argument("--json", type=Path, help="write the full comparisons as JSON")
    gate.add_argument("--html", type=Path, default=DEFAULT_HTML, help="HTML report: a .html file, or a folder (default: reports/)")
    compare = commands.add_parser("compare", help="compare two dumps made anywhere")
    compare.add_argument("dump_a", type=Path)
    compare.add_argument("dump_b", type=Path)
    compare.add_argument("--json", type=Path, help="write the full comparison as JSON")
    compare.add_argument("--html", type=Path, default=DEFAULT_HTML, help="HTML report: a .html file, or a folder (default: reports/)")
    return parser


def _dump_dirs(case, args, several: bool) -> dict[str, Path] | None:
    if args.side:
        if args.side not in case.sides:
            raise UsageError(f"{case.source}: no side {args.side!r} (sides: {', '.join(case.sides)})")
        if not args.dump:
            raise UsageError("--side needs --dump DIR: a single side has nothing to compare with")
        return {args.side: args.dump / case.name if several else args.dump}
    if args.dump:
        root = args.dump / case.name if several else args.dump
        return {side: root / side for side in case.sides}
    return None


def _load_all(paths: list[Path]) -> list:
    """Every case (and sweep point) of every file, all validated before any runs."""
    return [case for path in paths for case in load_cases(path)]


def _print_sweep_summaries(cases, status: dict[str, str], console: Console) -> None:
    """One line per sweep: how many of its points passed, how many were N/A (crashed points: not passing)."""
    sweeps: dict[str, list] = {}
    for case in cases:
        if case.sweep_of:
            sweeps.setdefault(case.sweep_of, []).append(case.name)
    for sweep, names in sweeps.items():
        ok = sum(status.get(name) == "pass" for name in names)
        unavailable = sum(status.get(name) == "n/a" for name in names)
        failing = [name for name in names if status.get(name) not in ("pass", "n/a")]
        counts = f"{ok} pass" + (f", {unavailable} N/A" if unavailable else "")
        tail = f"; not passing: {', '.join(failing)}" if failing else ""
        console.print(f"sweep {sweep}: {len(names)} points, {counts}{tail}", highlight=False, markup=False)


def _write_outputs(args, comparisons, console: Console) -> None:
    if not comparisons:
        return
    if args.json:
        console.print(f"JSON: {write_json(comparisons, args.json)}", highlight=False, markup=False)
    console.print(f"HTML report: {write_reports(comparisons, args.html)}", highlight=False, markup=False)


def _run_each(cases, console: Console, crashed: list[str], repeat: int, numerics: str | None,
              dump_dirs=lambda case: None):
    """Run the cases one by one, yielding each run; a crashed side is printed and noted in `crashed`."""
    for case in cases:
        try:
            with console.status(f"running {escape(case.name)} ..."):
                run = run_case(case, dump_dirs(case), repeat=repeat, numerics=numerics)
        except SideFailed as error:
            console.print(f"[bold red]CRASH[/] {escape(case.name)}: {escape(str(error))}", highlight=False)
            crashed.append(case.name)
            continue
        yield run


def cmd_run(args, console: Console) -> int:
    cases = _load_all(args.cases)
    comparisons, crashed = [], []
    dump_dirs = lambda case: _dump_dirs(case, args, len(cases) > 1)  # noqa: E731
    for run in _run_each(cases, console, crashed, args.repeat, args.numerics, dump_dirs):
        if run.comparison is None:
            for side, path in dump_dirs(run.case).items():
                print_side_dump(run.case_id, side, run.dumps[side], path, console)
            continue
        print_comparison(run.comparison, console)
        comparisons.append(run.comparison)
    if comparisons:
        _print_sweep_summaries(cases, {c.case_name: c.status for c in comparisons}, console)
    _write_outputs(args, comparisons, console)
    if crashed:
        return EXIT_SIDE_CRASHED
    return EXIT_OK if all(c.passed for c in comparisons) else EXIT_FAILED


def cmd_gate(args, console: Console) -> int:
    if args.only_failing and not args.update:
        raise UsageError("--only-failing goes with --update")
    if args.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    cases = _load_all(args.cases)
    comparisons, crashed, failed, gate_status = [], [], [], {}
    if not args.update:
        for case in cases:
            environment_class = class_of(case, args.numerics)
            if not baseline_dir(args.baseline, environment_class).is_dir():
                raise UsageError(missing_class_message(args.baseline, environment_class, [str(p) for p in args.cases]))
    for run in _run_each(cases, console, crashed, args.repeat, args.numerics):
        baseline = baseline_dir(args.baseline, run.environment_class)
        print_comparison(run.comparison, console)
        comparisons.append(run.comparison)
        golden = Golden.read(baseline, run.case_id)
        result = check(run, golden)
        if args.update and (not args.only_failing or result.golden_problems):
            new = Golden.from_run(run)
            new.write(baseline, with_arrays=not args.digests_only)
            console.print(f"golden {run.case_id}: {describe_update(golden, new)}", highlight=False, markup=False)
            result = check(run, Golden.read(baseline, run.case_id))
        print_gate_result(result, console)
        gate_status[run.case_id] = run.comparison.status if result.passed else "fail"
        if not result.passed:
            failed.append(run.case_id)
    _print_sweep_summaries(cases, gate_status, console)
    _write_outputs(args, comparisons, console)
    console.print(f"gate: {len(cases) - len(failed) - len(crashed)} passed, {len(failed)} failed"
                  + (f", {len(crashed)} crashed" if crashed else ""))
    return EXIT_SIDE_CRASHED if crashed else EXIT_FAILED if failed else EXIT_OK


def cmd_compare(args, console: Console) -> int:
    comparison = compare_dumps(Dump.read(args.dump_a), Dump.read(args.dump_b))
    print_comparison(comparison, console)
    _write_outputs(args, [comparison], console)
    return EXIT_OK if comparison.passed else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        return {"run": cmd_run, "gate": cmd_gate, "compare": cmd_compare}[args.command](args, console)
    except (CaseError, DumpError, InputMismatch, ProfileError, UsageError) as error:
        print(f"xfalign: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
