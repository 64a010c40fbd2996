"""xfalign command line.

Exit codes: 0 every expectation holds, 1 a check failed, 2 bad input or usage, 3 a side crashed or
timed out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from harness.case import CaseError, load_case
from harness.compare import InputMismatch, compare_dumps
from harness.dump import Dump, DumpError
from harness.reports.json_report import write_json
from harness.reports.terminal import print_comparison
from harness.runner import SideFailed, run_case

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_SIDE_CRASHED = 0, 1, 2, 3


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xfalign", description="Compare Paddle and Megatron-Core tensors, bit for bit.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run cases (both sides, or one with --side) and compare")
    run.add_argument("cases", nargs="+", type=Path, help="YAML case files")
    run.add_argument("--side", help="run only this side (needs --dump)")
    run.add_argument("--dump", type=Path, help="write dumps here: DIR/<side> (DIR/<case>/<side> for several cases), or DIR itself with --side")
    run.add_argument("--json", type=Path, help="write the full comparison as JSON")
    compare = commands.add_parser("compare", help="compare two dumps made anywhere")
    compare.add_argument("dump_a", type=Path)
    compare.add_argument("dump_b", type=Path)
    compare.add_argument("--json", type=Path, help="write the full comparison as JSON")
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


def cmd_run(args, console: Console) -> int:
    cases = [load_case(path) for path in args.cases]  # validate every file before running any
    comparisons, crashed = [], []
    for case in cases:
        try:
            with console.status(f"running {case.name} ..."):
                run = run_case(case, _dump_dirs(case, args, len(cases) > 1))
        except SideFailed as error:
            console.print(f"[bold red]CRASH[/] {case.name}: {error}", highlight=False)
            crashed.append(case.name)
            continue
        if run.comparison is None:
            for side, dump in run.dumps.items():
                console.print(f"{case.name}: side {side} dumped {len(dump.tensors)} tensors to {args.dump}")
            continue
        print_comparison(run.comparison, console)
        comparisons.append(run.comparison)
    if args.json and comparisons:
        console.print(f"JSON: {write_json(comparisons, args.json)}")
    if crashed:
        return EXIT_SIDE_CRASHED
    return EXIT_OK if all(c.passed for c in comparisons) else EXIT_FAILED


def cmd_compare(args, console: Console) -> int:
    comparison = compare_dumps(Dump.read(args.dump_a), Dump.read(args.dump_b))
    print_comparison(comparison, console)
    if args.json:
        console.print(f"JSON: {write_json([comparison], args.json)}")
    return EXIT_OK if comparison.passed else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        return {"run": cmd_run, "compare": cmd_compare}[args.command](args, console)
    except (CaseError, DumpError, InputMismatch, UsageError) as error:
        print(f"xfalign: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SideFailed as error:
        print(f"xfalign: side crashed: {error}", file=sys.stderr)
        return EXIT_SIDE_CRASHED


if __name__ == "__main__":
    sys.exit(main())
