"""xfalign command line. Its exit codes: harness.errors.ExitCode (and 128 + N, interrupted by signal N); its own
lines: harness.cli_text."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from safetensors import SafetensorError

from harness import __version__
from harness.case import REFERENCE_SIDE, reseeded
from harness.cli_text import (
    REFETCH_HEADER,
    crash_text,
    error_line,
    gate_summary_text,
    golden_unreadable_text,
    goldens_written_text,
    internal_error_line,
    interrupted_line,
    jobs_capped_text,
    map_written_text,
    missing_class_text,
    progress_line,
    refetch_written_text,
    running_text,
    sweep_summary_text,
    tree_goldens_written_text,
    written_text,
)
from harness.compare.case import compare_dumps
from harness.compare.tree import compare_trees
from harness.errors import ExitCode, Interrupted, OutputError, SideCrashed, UsageError, XfalignError, safe_name
from harness.gate import (
    GateResult,
    TreeGateResult,
    check,
    gate_tree,
    golden_problem,
    settle,
    tree_gate_comparison,
    tree_gate_steps,
)
from harness.golden_policy import GoldenPolicy, from_update
from harness.inputs import DEFAULT_MAX_INPUT_GIB, RUN_FLOAT64_COPIES, check_input_size
from harness.load import load_cases
from harness.ops import reference_framework
from harness.reports.html import write_reports, write_tree_report
from harness.reports.json_report import write_json, write_tree_json
from harness.reports.terminal import (
    print_comparison,
    print_gate_result,
    print_side_dump,
    print_tree_comparison,
    print_tree_gate_result,
)
from harness.reports.text import golden_update_text, unused_golden_text, warning_line
from harness.run_options import DEFAULT_SIDE_TIMEOUT_S, RunOptions
from harness.runner import WorkerPool, current_pool, interrupt_handler, run_cases
from harness.store.atomic import write_text_atomic
from harness.store.dump import Dump, DumpError, check_dump_target
from harness.store.golden import Golden, GoldenMismatch, baseline_dir, environment_classes, file_stem, unused_goldens
from harness.store.tree import is_tree, read_tree

DEFAULT_HTML = Path("reports")
NUMERICS_HELP = ("numerics profile for every case (NAME: a built-in profile or a path); default: the case's, "
                 "else portable-avx2")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


JOBS_HELP = f"run up to N cases at once, at most one per core (default: the number of cores, here {usable_cores()})"
MAX_INPUT_HELP = (f"refuse cases whose inputs need more (default {DEFAULT_MAX_INPUT_GIB:g} GiB, and cases whose run "
                  f"would need more than this machine's memory: about {RUN_FLOAT64_COPIES:g} float64 copies of its "
                  "inputs at its peak); a limit given replaces both")
TIMEOUT_HELP = (f"seconds each side may run, from its worker's start (default: the case's `timeout`, "
                f"else {DEFAULT_SIDE_TIMEOUT_S}); a side past it is killed (exit 3)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xfalign", description="Compare Paddle and Megatron-Core tensors, bit for bit.")
    parser.add_argument("--version", action="version", version=f"xfalign {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run cases (both sides, or one with --side) and compare")
    run.add_argument("cases", nargs="+", type=Path, help="YAML case files")
    run.add_argument("--side", help="run only this side (needs --dump); `exact`: only the float64 reference")
    run.add_argument("--dump", type=Path,
                     help="write dumps here: DIR/<side> (DIR/<case>/<side> for several cases), or DIR itself with --side")
    run.add_argument("--repeat", type=int, default=1, help="run each side N times; report digests that vary")
    run.add_argument("--numerics", metavar="PROFILE", help=NUMERICS_HELP)
    run.add_argument("--json", type=Path, help="write the full comparison as JSON")
    run.add_argument("--html", type=Path, default=DEFAULT_HTML, help="HTML report: a .html file, or a folder (default: reports/)")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help=TIMEOUT_HELP)
    run.add_argument("-j", "--jobs", type=int, metavar="N", help=JOBS_HELP)
    run.add_argument("--seeds", type=int, default=0, metavar="N",
                     help="run each case with N seeds other than its own instead (expectations that state properties hold for any seed)")
    run.add_argument("--no-reference", action="store_true", help="do not compute the float64 reference (no arbiter)")
    run.add_argument("--max-input-gib", type=float, metavar="GIB", help=MAX_INPUT_HELP)
    gate = commands.add_parser("gate", help="CI gate: expectations, goldens, determinism")
    gate.add_argument("cases", nargs="*", type=Path, help="YAML case files (or --tree)")
    gate.add_argument("--baseline", type=Path, required=True,
                      help="folder of goldens: DIR/<environment class>/ (or DIR itself when it holds goldens)")
    gate.add_argument("--numerics", metavar="PROFILE", help=NUMERICS_HELP)
    gate.add_argument("--golden", choices=GoldenPolicy.choices(), metavar="POLICY",
                      help="what to do with goldens: check (write none), write-missing (default: a missing golden is "
                           "written and fails once), force-regen (rewrite the failing ones, then check), regen-all "
                           "(rewrite every one, then check); a drifted golden left as it is gets <case>.golden.obtained.yaml "
                           "beside it")
    gate.add_argument("--update", action="store_true", help="(re)write every golden: --golden regen-all")
    gate.add_argument("--only-failing", action="store_true",
                      help="with --update: only goldens that do not match: --golden force-regen")
    gate.add_argument("--warn-unused", action="store_true",
                      help="list the goldens in the baseline folder (of this run's environment class) that no case produces")
    gate.add_argument("--repeat", type=int, default=1, help="run each side N times to detect nondeterminism")
    gate.add_argument("--digests-only", action="store_true", help="goldens written store digests, not tensor values")
    gate.add_argument("--json", type=Path, help="write the full comparisons as JSON")
    gate.add_argument("--html", type=Path, default=DEFAULT_HTML, help="HTML report: a .html file, or a folder (default: reports/)")
    gate.add_argument("--timeout", type=float, metavar="SECONDS", help=TIMEOUT_HELP)
    gate.add_argument("-j", "--jobs", type=int, metavar="N", help=JOBS_HELP)
    gate.add_argument("--no-reference", action="store_true", help="do not compute the float64 reference (no arbiter)")
    gate.add_argument("--max-input-gib", type=float, metavar="GIB", help=MAX_INPUT_HELP)
    compare = commands.add_parser("compare", help="compare two dumps, or two capture trees, made anywhere")
    compare.add_argument("dump_a", type=Path, metavar="A", help="a dump, or a capture tree (holds capture.json)")
    compare.add_argument("dump_b", type=Path, metavar="B", help="the same kind as A")
    compare.add_argument("--map", type=Path, help="trees: YAML map of B's tensor names and layouts to A's")
    compare.add_argument("--refetch", type=Path, metavar="FILE",
                         help="trees: write per side the modules whose tensors differ (YAML), for "
                              "capture(..., mode=\"digests-then-full\", refetch=FILE)")
    compare.add_argument("--steps", choices=("first", "all"),
                         help="trees of several steps: the tensor table of the first divergent step only (default), "
                              "or of every step; a per-step summary comes first either way")
    compare.add_argument("--exact", type=Path, metavar="DIR",
                         help="two dumps: the float64 reference's dump of the same case (`run --dump` writes it to DIR/exact)")
    compare.add_argument("--json", type=Path, help="write the full comparison as JSON")
    compare.add_argument("--html", type=Path, default=DEFAULT_HTML, help="HTML report: a .html file, or a folder (default: reports/)")
    gate.add_argument("--tree", type=Path, help="gate a capture tree instead of cases: a golden per step (digests)")
    mapping = commands.add_parser("map", help="maps between two capture trees' tensor names")
    map_commands = mapping.add_subparsers(dest="map_command", required=True)
    suggest = map_commands.add_parser("suggest", help="propose a map from execution order and shapes (YAML)")
    suggest.add_argument("tree_a", type=Path)
    suggest.add_argument("tree_b", type=Path)
    suggest.add_argument("-o", "--output", type=Path, help="write the YAML here (default: print it)")
    for command in (run, gate, compare, mapping, suggest):  # --debug also after the subcommand
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error")
    return parser


def _dump_dirs(case, args, several: bool) -> dict[str, Path] | None:
    """Where each side of `case` is dumped; folder names made of case names and side names are made safe
    file names (sweep point names hold '[', ',', '=')."""
    if args.side:
        if args.side == REFERENCE_SIDE:
            if reference_framework(case) is None:
                raise UsageError(f"{case.source}: op family {case.op} declares no float64 reference")
        elif args.side not in case.sides:
            raise UsageError(f"{case.source}: no side {args.side!r} (sides: {', '.join(case.sides)}; "
                             f"{REFERENCE_SIDE}: the float64 reference)")
        if not args.dump:
            raise UsageError("--side needs --dump DIR: a single side has nothing to compare with")
        return {args.side: args.dump / file_stem(case.name) if several else args.dump}
    if args.dump:
        root = args.dump / file_stem(case.name) if several else args.dump
        folders = {side: root / safe_name(side) for side in case.sides}
        if not getattr(args, "no_reference", False) and reference_framework(case) is not None:
            folders[REFERENCE_SIDE] = root / REFERENCE_SIDE
        if len(set(folders.values())) < len(folders):
            raise UsageError(f"{case.source}: sides {' and '.join(repr(s) for s in case.sides)} would be dumped to one folder "
                             f"{folders[next(iter(case.sides))]}; rename one")
        return folders
    return None


def _plan_dumps(cases, args) -> dict[str, dict[str, Path] | None]:
    """Every case's dump folders, decided (and refused if two cases share one) before anything runs."""
    plan: dict[str, dict[str, Path] | None] = {}
    owner: dict[Path, str] = {}  # dump folder -> the case dumped there
    for case in cases:
        plan[case.name] = _dump_dirs(case, args, len(cases) > 1)
        for folder in (plan[case.name] or {}).values():
            if folder in owner and owner[folder] != case.name:
                raise UsageError(f"cases {owner[folder]!r} and {case.name!r} would be dumped to one folder {folder}; rename one")
            owner[folder] = case.name
    return plan


def _load_all(paths: list[Path], options: RunOptions) -> list:
    """Every case (and sweep point) of every file, all validated before any runs; two cases with one name
    (their reports, dumps and goldens would overwrite each other) are refused."""
    cases = []
    seen: dict[str, Path] = {}  # case name -> the file that defines it
    for path in paths:
        for case in load_cases(path, options.profiles):
            if case.name in seen:
                first = seen[case.name]
                where = (f"{path} is given twice" if Path(first).resolve() == Path(path).resolve()
                         else f"in {first} and in {path}")
                raise UsageError(f"two cases named {case.name!r}: {where} (case names must be unique in a run; "
                                 f"set `name:` in one of them)")
            seen[case.name] = path
            check_input_size(case, options.max_input_gib)  # before anything runs or allocates (None: the default limit,
            # and what this machine's memory holds for the run's peak)
            cases.append(case)
    return cases


def _check_output(path: Path, option: str, kind: str, write_in: Path | None = None) -> None:
    """Refuse, before any side runs, an output that cannot be written: if `path` exists it must be a
    `kind` ('file' or 'dir'); the folder written in (`write_in`; default: the path itself for a folder,
    its parent for a file) must exist or be creatable, and be writable (a temporary file is created and
    removed in it, or in its nearest existing ancestor)."""
    if path.exists():
        if kind == "file" and not path.is_file():
            what = "is a directory, not a file" if path.is_dir() else "exists and is not a regular file"
            raise OutputError(f"{option} {path}: {what}")
        if kind == "dir" and not path.is_dir():
            raise OutputError(f"{option} {path}: exists and is not a directory")
    folder = write_in if write_in is not None else path if kind == "dir" else path.parent
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"{option} {path}: {probe} is not a directory")
    try:
        handle, name = tempfile.mkstemp(prefix=".xfalign-probe-", dir=probe)
        os.close(handle)
        os.unlink(name)
    except OSError as error:
        raise OutputError(f"{option} {path}: cannot write in {probe}: {error.strerror or error}") from None


def _check_reports(args) -> None:
    if getattr(args, "json", None):
        _check_output(args.json, "--json", "file")
    _check_output(args.html, "--html", "file" if args.html.suffix == ".html" else "dir")


def _check_dumps(plan: dict[str, dict[str, Path] | None]) -> None:
    """Each dump folder is swapped in for what is there (harness.store.dump.check_dump_target says what may
    be replaced: nothing xfalign did not write, no other side's dump); checked before any side runs."""
    for folders in plan.values():
        for side, folder in (folders or {}).items():
            _check_output(folder, "--dump", "dir", write_in=folder.parent)
            check_dump_target(folder, side, label="--dump")


def _run_options(args) -> RunOptions:
    """Options of `run` and `gate`, refused or settled before anything is read or run. -j above the cores is
    capped, with a warning: more workers than cores only take memory (each holds a framework) and time."""
    if args.repeat < 1:
        raise UsageError(f"--repeat must be >= 1 (got {args.repeat})")
    cores = usable_cores()
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"-j must be >= 1 (got {args.jobs})")
    if args.jobs is not None and args.jobs > cores:
        print(warning_line(jobs_capped_text(args.jobs, cores)), file=sys.stderr)
    args.jobs = min(args.jobs or cores, cores)
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds (got {args.timeout:g})")
    if args.max_input_gib is not None and not args.max_input_gib > 0:
        raise UsageError(f"--max-input-gib must be a positive number of GiB (got {args.max_input_gib:g})")
    # a --numerics profile that does not load is refused here, before any case is read
    return RunOptions(repeat=args.repeat, numerics=args.numerics, timeout=args.timeout, max_input_gib=args.max_input_gib,
                      reference=not getattr(args, "no_reference", False))


@contextmanager
def _writing(path: Path, what: str):
    """An OSError while writing an output (no permission, disk full) is exit 2 naming the path."""
    try:
        yield
    except OSError as error:
        raise OutputError(f"cannot write {what} {path}: {error.strerror or error}") from None
    except SafetensorError as error:
        raise OutputError(f"cannot write {what} {path}: {error}") from None


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
        console.print(sweep_summary_text(sweep, len(names), ok, unavailable, failing), highlight=False, markup=False)


class CaseProgress:
    """Progress of a run of several cases: on a terminal a rich bar (done/total, current case, elapsed),
    results printed above it; otherwise one plain line per case as its result comes
    (`[3/40] name (12.3 s)`, harness.cli_text.progress_line)."""

    def __init__(self, console: Console, names: list[str]):
        self.console, self.names, self.total, self.done = console, names, len(names), 0
        self.started = time.monotonic()
        self.bar = None
        if self.total and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console, transient=True)
            self.task = self.bar.add_task(escape(running_text(names[0])), total=self.total)

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self, name: str) -> None:
        """Case `name` is done (cases come in order): count it, name the next."""
        self.done += 1
        if self.bar is not None:
            following = running_text(self.names[self.done]) if self.done < self.total else "done"
            self.bar.update(self.task, advance=1, description=escape(following))
        elif self.total > 1:
            self.console.print(progress_line(self.done, self.total, name, time.monotonic() - self.started),
                               highlight=False, markup=False)


def _write_outputs(args, comparisons, console: Console, json_writer=write_json, html_writer=write_reports) -> None:
    """The JSON report (with --json) and the HTML report of what was compared (case comparisons, or a tree
    comparison with its writers)."""
    if not comparisons:
        return
    if args.json:
        with _writing(args.json, "the JSON report"):
            written = json_writer(comparisons, args.json)
        console.print(written_text("JSON", written), highlight=False, markup=False)
    with _writing(args.html, "the HTML report"):
        written = html_writer(comparisons, args.html)
    console.print(written_text("HTML report", written), highlight=False, markup=False)


@contextmanager
def _pool(args):
    """The workers of this command: the default pool when one is active (tests), else its own."""
    shared = current_pool()
    if shared is not None:
        yield shared
        return
    with WorkerPool(jobs=args.jobs) as pool:
        yield pool


def _run_each(cases, console: Console, crashed: list[str], args, options: RunOptions, dump_dirs=lambda case: None):
    """Run the cases (up to -j at once), yielding each run in case order as it becomes available; a
    crashed side is printed and noted in `crashed`. Progress: a bar on a terminal, a plain line per case
    otherwise (several cases only)."""
    with _pool(args) as pool, CaseProgress(console, [case.name for case in cases]) as progress:
        runs = run_cases(cases, dump_dirs, options, pool=pool, jobs=args.jobs)
        for case, run in runs:
            progress.advance(case.name)
            if isinstance(run, SideCrashed):
                progress.console.print(Text(crash_text(case.name, run), style="bold red"), highlight=False)
                crashed.append(case.name)
                continue
            yield run


def cmd_run(args, console: Console) -> int:
    options = _run_options(args)
    cases = _load_all(args.cases, options)
    if args.seeds:
        if args.seeds < 0:
            raise UsageError("--seeds takes a positive N")
        cases = [reseeded(case, k) for case in cases for k in range(1, args.seeds + 1)]
    plan = _plan_dumps(cases, args)
    _check_dumps(plan)
    if not args.side:  # one side: nothing compared, no report written
        _check_reports(args)
    comparisons = []
    crashed: list[str] = []
    for run in _run_each(cases, console, crashed, args, options, lambda case: plan[case.name]):
        if run.comparison is None:
            dirs = plan[run.case.name]
            assert dirs is not None  # nothing is compared only with --side, which needs --dump (_dump_dirs)
            for side, path in dirs.items():
                print_side_dump(run.case_name, side, run.dumps[side], path, console)
            continue
        print_comparison(run.comparison, console)
        comparisons.append(run.comparison)
    if comparisons:
        _print_sweep_summaries(cases, {c.case_name: c.status for c in comparisons}, console)
    _write_outputs(args, comparisons, console)
    if crashed:
        return ExitCode.SIDE_CRASHED
    return ExitCode.OK if all(c.passed for c in comparisons) else ExitCode.FAILED


def _policy(args) -> GoldenPolicy:
    """The golden policy of `gate`'s options (harness.golden_policy.from_update), or a usage error."""
    try:
        return from_update(args.update, args.only_failing, args.golden)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _golden_folders(cases, args, options: RunOptions) -> dict[str, Path]:
    """Each case's golden folder, decided before any side runs: with --golden check the folder of its class must
    exist; two cases whose names make one golden file name (which one would overwrite) are refused."""
    folders: dict[str, Path] = {}
    owner: dict[Path, str] = {}  # golden file -> the case it is for
    for case in cases:
        environment_class = options.settings(case).environment_class
        folder = baseline_dir(args.baseline, environment_class)
        if args.policy is GoldenPolicy.CHECK and not folder.is_dir():
            raise UsageError(missing_class_text(args.baseline, environment_class, environment_classes(args.baseline),
                                                [str(p) for p in args.cases]))
        path = Golden.text_path(folder, case.name)
        if path in owner:
            raise UsageError(f"cases {owner[path]!r} and {case.name!r} would have one golden {path}; rename one")
        folders[case.name], owner[path] = folder, case.name
    return folders


def _golden_problems(cases, folders: dict[str, Path], policy: GoldenPolicy, console: Console) -> dict[str, GateResult]:
    """Every golden read before any side runs. A case whose golden cannot be read fails (not run) and is said
    at once; force-regen and regen-all rewrite an unreadable one, but a golden of another case is never overwritten."""
    problems = {}
    for case in cases:
        error = golden_problem(folders[case.name], case.name)
        if error is not None and (not policy.rewrites_unreadable or isinstance(error, GoldenMismatch)):
            problems[case.name] = GateResult.of_unreadable(case.name, error)
            print_gate_result(problems[case.name], console)
    return problems


def _gate_run(run, folder: Path, args, console: Console, written: list[str]) -> GateResult:
    """One case's run against its golden under the golden policy (harness.gate.settle); force-regen and regen-all
    rewrite an unreadable one."""
    policy: GoldenPolicy = args.policy
    try:
        golden = Golden.read(folder, run.case_name)
    except (DumpError, GoldenMismatch) as error:  # changed since it was read before the run
        if not policy.rewrites_unreadable or isinstance(error, GoldenMismatch):
            return GateResult.of_unreadable(run.case_name, error)
        console.print(golden_unreadable_text(run.case_name, error), highlight=False, markup=False)
        golden = None
    with _writing(folder, "the golden in"):
        result = settle(policy, folder, run.case_name, golden, Golden.from_run(run), lambda g: check(run, g), written,
                        with_arrays=not args.digests_only)
    if result.update is not None and policy.passes_written:
        console.print(golden_update_text(run.case_name, result.update, result.written), highlight=False, markup=False)
    return result


def _print_unused(names_by_folder: dict[Path, list[str]], console: Console) -> list[Path]:
    """`--warn-unused`: the goldens in each baseline folder of the run that none of its cases (or steps) has."""
    unused = [path for folder, names in names_by_folder.items() if folder.is_dir()
              for path in unused_goldens(folder, names)]
    for path in unused:
        console.print(warning_line(unused_golden_text(path)), highlight=False, markup=False, soft_wrap=True)
    return unused


def _unreadable_error(results: Sequence[GateResult]) -> XfalignError | None:
    """What the gate ends with (exit 2) when goldens could not be read: the first, and how many more."""
    errors = [result.unreadable for result in results if result.unreadable is not None]
    if not errors:
        return None
    more = f" (and {len(errors) - 1} more unreadable goldens)" if len(errors) > 1 else ""
    return type(errors[0])(f"{errors[0]}{more}")


def cmd_gate(args, console: Console) -> int:
    if args.tree is not None:
        return cmd_gate_tree(args, console)
    if not args.cases:
        raise UsageError("gate needs case files, or --tree TREE")
    args.policy = _policy(args)
    options = _run_options(args)
    cases = _load_all(args.cases, options)
    _check_reports(args)
    if args.policy is not GoldenPolicy.CHECK:
        _check_output(args.baseline, "--baseline", "dir")
    folders = _golden_folders(cases, args, options)
    problems = _golden_problems(cases, folders, args.policy, console)
    results, comparisons = list(problems.values()), []
    crashed: list[str] = []
    gate_status = {name: "fail" for name in problems}
    written: list[str] = []  # goldens in place, in order: said as each is written, and in sum even when interrupted
    try:
        for run in _run_each([case for case in cases if case.name not in problems], console, crashed, args, options):
            print_comparison(run.comparison, console)
            comparisons.append(run.comparison)
            result = _gate_run(run, folders[run.case_name], args, console, written)
            print_gate_result(result, console)
            results.append(result)
            gate_status[run.case_name] = run.comparison.status if result.passed else "fail"
    finally:
        if args.policy.passes_written or written:
            console.print(goldens_written_text(written, len(cases)), highlight=False, markup=False)
    if args.warn_unused:
        names: dict[Path, list[str]] = {}
        for case in cases:
            names.setdefault(folders[case.name], []).append(case.name)
        _print_unused(names, console)
    _print_sweep_summaries(cases, gate_status, console)
    goldens = {result.case_name: result.golden_environment for result in results if result.golden_environment is not None}
    _write_outputs(args, comparisons, console, html_writer=partial(write_reports, goldens=goldens))
    failed = sum(not result.passed for result in results)
    console.print(gate_summary_text(len(cases) - failed - len(crashed), failed, len(crashed)), markup=False)
    unreadable = _unreadable_error(results)
    if unreadable is not None:
        raise unreadable
    return ExitCode.SIDE_CRASHED if crashed else ExitCode.FAILED if failed else ExitCode.OK


def cmd_compare(args, console: Console) -> int:
    trees = [is_tree(path) for path in (args.dump_a, args.dump_b)]
    if any(trees):
        if not all(trees):
            tree, other = (args.dump_a, args.dump_b) if trees[0] else (args.dump_b, args.dump_a)
            raise UsageError(f"{tree} is a capture tree but {other} is not: compare two trees or two dumps")
        if args.exact:
            raise UsageError("--exact goes with two dumps of a case, not capture trees (replay runs modules in float64)")
        return cmd_compare_trees(args, console)
    given = next((option for option, value in (("--map", args.map), ("--refetch", args.refetch), ("--steps", args.steps))
                  if value), None)
    if given:
        raise UsageError(f"{given} goes with two capture trees (folders with capture.json)")
    _check_reports(args)
    if args.exact is not None and is_tree(args.exact):
        raise UsageError(f"--exact {args.exact} is a capture tree: it takes the float64 reference's dump of the same case")
    exact = Dump.read(args.exact, check_bytes=False) if args.exact is not None else None
    comparison = compare_dumps(Dump.read(args.dump_a, check_bytes=False), Dump.read(args.dump_b, check_bytes=False),
                               exact=exact, exact_missing="no float64 reference was given (compare A B --exact DIR)")
    print_comparison(comparison, console)
    _write_outputs(args, [comparison], console)
    return ExitCode.OK if comparison.passed else ExitCode.FAILED


def _load_map(path: Path | None):
    if path is None:
        return None
    from harness.capture.mapping import load_map  # lazy: only trees compared through a map need it

    return load_map(path)


def cmd_compare_trees(args, console: Console) -> int:
    _check_reports(args)
    if args.refetch:
        _check_output(args.refetch, "--refetch", "file")
    tree = compare_trees(args.dump_a, args.dump_b, _load_map(args.map), map_path=args.map)
    print_tree_comparison(tree, console, args.steps or "first")
    if args.refetch:
        sides = tree.refetch()
        with _writing(args.refetch, "the refetch list"):
            write_text_atomic(args.refetch, REFETCH_HEADER + yaml.safe_dump(sides, sort_keys=False))
        console.print(refetch_written_text(args.refetch, sides), highlight=False, markup=False)
    _write_outputs(args, tree, console, write_tree_json, write_tree_report)
    return ExitCode.OK if tree.passed else ExitCode.FAILED


def cmd_gate_tree(args, console: Console) -> int:
    if args.cases:
        raise UsageError("--tree gates a capture tree: give no case files with it")
    policy = _policy(args)
    given = [option for option, value in (("--digests-only", args.digests_only),
                                          ("--repeat", args.repeat != 1), ("--numerics", args.numerics),
                                          ("--timeout", args.timeout), ("-j", args.jobs),
                                          ("--no-reference", args.no_reference), ("--max-input-gib", args.max_input_gib))
             if value is not None and value is not False]
    if given:
        raise UsageError(f"--tree goes with --baseline, --golden (or --update [--only-failing]), --warn-unused, --json "
                         f"and --html only, not {given[0]} "
                         "(a tree's golden holds its digests: nothing runs)")
    _check_output(args.baseline, "--baseline", "dir")
    _check_reports(args)
    tree = read_tree(args.tree)
    steps = tree_gate_steps(tree)
    results: list[TreeGateResult] = []
    written: list[str] = []  # goldens in place, in step order: said in sum even when interrupted
    try:
        for result in gate_tree(tree, args.baseline, policy, written=written):
            print_tree_gate_result(result, console)
            results.append(result)
    finally:
        if policy.passes_written or written:
            console.print(tree_goldens_written_text(written, steps), highlight=False, markup=False)
    if args.warn_unused:
        _print_unused({args.baseline: steps}, console)
    _write_outputs(args, tree_gate_comparison(tree, args.baseline, results), console, write_tree_json, write_tree_report)
    failed = sum(not result.passed for result in results)
    console.print(gate_summary_text(len(results) - failed, failed, 0), markup=False)
    unreadable = _unreadable_error(results)
    if unreadable is not None:
        raise unreadable
    return ExitCode.FAILED if failed else ExitCode.OK


def cmd_map(args, console: Console) -> int:
    from harness.capture.suggest import suggest_map  # lazy: only `map suggest` needs it

    text = suggest_map(read_tree(args.tree_a), read_tree(args.tree_b))
    if args.output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return ExitCode.OK
    _check_output(args.output, "-o", "file")
    with _writing(args.output, "the map"):
        write_text_atomic(args.output, text)
    console.print(map_written_text(args.output), highlight=False, markup=False)
    return ExitCode.OK


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):  # kill the workers' groups, remove temp folders, exit 128+N
        try:
            previous[signum] = signal.signal(signum, interrupt_handler)
        except ValueError:  # not the main thread (main() called from a thread): leave the handlers alone
            pass
    try:
        commands = {"run": cmd_run, "gate": cmd_gate, "compare": cmd_compare, "map": cmd_map}
        return commands[args.command](args, console)
    except XfalignError as error:
        if args.debug:
            traceback.print_exc()
        print(error_line(error), file=sys.stderr)
        return error.exit_code
    except (Interrupted, KeyboardInterrupt) as error:
        interrupted = error if isinstance(error, Interrupted) else Interrupted(signal.SIGINT)
        print(interrupted_line(interrupted.signal_name), file=sys.stderr)
        return interrupted.exit_code
    except Exception as error:  # a bug in xfalign, or in something it calls: still one line
        if args.debug:
            traceback.print_exc()
        print(internal_error_line(type(error).__name__, _first_line(error), args.debug), file=sys.stderr)
        return ExitCode.ERROR
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
