"""The command line's own lines: its progress, the files it wrote, its summaries and its errors. The words of
results (findings, verdicts, tables, gate lines) are harness.reports.text's; these are said by harness.cli only."""

from __future__ import annotations

# -- progress and summaries ------------------------------------------------------------------------------


def running_text(case_name: str) -> str:
    return f"running {case_name}"


def progress_line(done: int, total: int, case_name: str, elapsed_s: float) -> str:
    """A run of several cases printed where the output is not a terminal: one line as each case's
    result comes, before that result."""
    return f"[{done}/{total}] {case_name} ({elapsed_s:.1f} s)"


def crash_text(case_name: str, error) -> str:
    return f"CRASH {case_name}: {error}"


def sweep_summary_text(sweep: str, points: int, passed: int, unavailable: int, failing: list[str]) -> str:
    """One line per sweep: `sweep linear: 3 points, 2 pass, 1 N/A; not passing: ...`."""
    counts = f"{passed} pass" + (f", {unavailable} N/A" if unavailable else "")
    tail = f"; not passing: {', '.join(failing)}" if failing else ""
    return f"sweep {sweep}: {points} points, {counts}{tail}"


def gate_summary_text(passed: int, failed: int, crashed: int) -> str:
    return f"gate: {passed} passed, {failed} failed" + (f", {crashed} crashed" if crashed else "")


# -- goldens -------------------------------------------------------------------------------------------


def missing_class_text(root, environment_class: str, present: list[str], case_files: list[str]) -> str:
    """One line for a machine whose class has no goldens: which class it is, how to create them."""
    there = f" (classes there: {', '.join(present)})" if present else ""
    return (f"this run's environment class is {environment_class}; {root} has no goldens for it{there}. "
            f"Create them with: xfalign gate {' '.join(case_files)} --baseline {root} --update")


def golden_unreadable_text(case_name: str, error) -> str:
    return f"golden {case_name}: unreadable, rewriting it ({error})"


def goldens_written_text(written: list[str], total: int) -> str:
    names = f": {', '.join(written)}" if 0 < len(written) < total else ""
    return f"goldens written: {len(written)} of {total}{names}"


def tree_goldens_written_text(written: list[str], steps: list[str]) -> str:
    """An update of a tree's goldens goes in step order: one stopped part way wrote the first of them."""
    if 2 < len(written) < len(steps) and written == steps[:len(written)]:
        return (f"goldens written: {len(written)} of {len(steps)}: the first {len(written)} steps, {written[0]} to "
                f"{written[-1]}; the others are as they were")
    return goldens_written_text(written, len(steps))


# -- files written -------------------------------------------------------------------------------------

REFETCH_HEADER = ("# xfalign refetch: per side, the modules whose tensors differ (or whose digests differ and\n"
                  "# have no values). Give it to capture(..., mode=\"digests-then-full\", refetch=THIS_FILE).\n")


def written_text(what: str, path) -> str:
    """`JSON: path`, `HTML report: path`."""
    return f"{what}: {path}"


def refetch_written_text(path, sides: dict[str, list[str]]) -> str:
    counts = ", ".join(f"{side} {len(modules)}" for side, modules in sides.items())
    return f"refetch list (modules per side: {counts}): {path}"


def map_written_text(path) -> str:
    return f"map suggestion: {path}"


# -- errors (exit codes: harness.errors) -----------------------------------------------------------------


def error_line(error) -> str:
    return f"xfalign: error: {error}"


def jobs_capped_text(asked: int, cores: int) -> str:
    return f"-j {asked} is more than the {cores} cores here: running up to {cores} cases at once"


def interrupted_line(signal_name: str) -> str:
    return f"xfalign: interrupted by {signal_name}"


def internal_error_line(kind: str, first_line: str, debug: bool) -> str:
    return f"xfalign: internal error: {kind}: {first_line}" + ("" if debug else " (run with --debug for the traceback)")
