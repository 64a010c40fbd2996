"""pytest plugin: `pytest cases/` collects each YAML case as a test item.

A failing item shows the per-tensor table and every problem; with `--xfalign-baseline DIR` the goldens
are checked too, under the golden policy of `xfalign gate` (harness.golden_policy), chosen with
`--xfalign-golden POLICY`: `write-missing` (the default, as pytest-regressions: a missing golden is written and
its item fails once), `check` (write none), `force-regen` (rewrite the failing goldens, then check: the item
passes unless an expectation fails), `regen-all` (rewrite all). `--xfalign-update` is `force-regen`. A golden
that drifted and was left as it is gets `<case>.golden.obtained.yaml` beside it, removed when it passes again.
`--xfalign-warn-unused` lists, at the end, the goldens in the baseline folders used that no item produced.

What is collected: YAML case files named on the command line, or found in a folder named there (or in
the invocation folder when pytest is given no paths and has no `testpaths`), and those the ini option
`xfalign_cases` lists (paths or globs, relative to the rootdir). A plain `pytest` that runs `testpaths`
collects only `xfalign_cases`. A case file that does not load is one collection error with its one-line
message. The plugin is loaded by every pytest run: the harness (numpy, the runner, the reports) is
imported only when a case file is collected, and no framework ever is.
"""

from __future__ import annotations

import glob
import io
import re
from pathlib import Path

import pytest

CASE_KEYS = {"op", "sides", "inputs"}
GOLDEN_SUFFIXES = (".golden.yaml", ".golden.yml", ".golden.obtained.yaml")  # goldens, and what drifted from them
_TOP_LEVEL_KEY = re.compile(r"^(op|sides|inputs)\s*:", re.MULTILINE)
_SNIFF_BYTES = 1 << 20
_CONFIGURED = pytest.StashKey[set]()
_POOL = pytest.StashKey[object]()
_PROFILES = pytest.StashKey[object]()  # the session's numerics profiles, each read once
_OPTIONS = pytest.StashKey[object]()
_PRODUCED = pytest.StashKey[dict]()  # baseline folder -> the case names whose goldens are there (--xfalign-warn-unused)
POLICIES = ("check", "write-missing", "force-regen", "regen-all")  # harness.golden_policy.GoldenPolicy (not imported:
# the plugin imports no harness module until a case is collected)


class CaseFailed(Exception):
    """The case's checks failed; the message is the report to show."""


def pytest_addoption(parser):
    group = parser.getgroup("xfalign")
    group.addoption("--xfalign-baseline", type=Path, help="check goldens in this folder (DIR/<environment class>/) too")
    group.addoption("--xfalign-numerics", help="numerics profile for every case (default: the case's, else portable-avx2)")
    group.addoption("--xfalign-golden", choices=POLICIES, metavar="POLICY",
                    help="with --xfalign-baseline: check (write no golden), write-missing (default: a missing golden "
                         "is written and its item fails once), force-regen (rewrite the failing goldens, then check), "
                         "regen-all (rewrite every golden, then check)")
    group.addoption("--xfalign-update", action="store_true",
                    help="with --xfalign-baseline: rewrite goldens that do not match: --xfalign-golden force-regen")
    group.addoption("--xfalign-warn-unused", action="store_true",
                    help="with --xfalign-baseline: list the goldens in the baseline folders that no item produced")
    group.addoption("--xfalign-repeat", type=int, default=1, help="run each side N times (nondeterminism)")
    parser.addini("xfalign_cases", type="linelist", default=[],
                  help="YAML case files, folders or globs (relative to the rootdir) that pytest collects even when "
                       "not named on the command line (default: none; named ones are always collected)")


def _configured(config) -> set[Path]:
    """Files and folders that the ini option xfalign_cases names, resolved once per session."""
    if _CONFIGURED not in config.stash:
        found: set[Path] = set()
        for pattern in config.getini("xfalign_cases"):
            full = str(config.rootpath / pattern)
            matches = glob.glob(full, recursive=True) if glob.has_magic(pattern) else [full]
            found.update(Path(m).resolve() for m in matches)
        config.stash[_CONFIGURED] = found
    return config.stash[_CONFIGURED]


def pytest_configure(config):
    """A plain `pytest` (collecting `testpaths`) also collects the paths xfalign_cases names."""
    if config.getoption("xfalign_baseline") is None:
        for option in ("update", "golden", "warn_unused"):
            if config.getoption(f"xfalign_{option}"):
                name = f"--xfalign-{option.replace('_', '-')}"
                raise pytest.UsageError(f"{name} needs --xfalign-baseline DIR (the goldens to {_WHAT[option]})")
    policy = config.getoption("xfalign_golden")
    if config.getoption("xfalign_update") and policy not in (None, "force-regen"):
        raise pytest.UsageError(f"--xfalign-update is --xfalign-golden force-regen, not --xfalign-golden {policy}: "
                                "give one of them")
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        roots = [(config.rootpath / arg.split("::")[0]).resolve() for arg in config.args]
        config.args.extend(str(p) for p in sorted(_configured(config)) if p.exists() and not _under(p, roots))


_WHAT = {"update": "rewrite", "golden": "check or write", "warn_unused": "look through"}


def _policy(config):
    """The golden policy of this session's options."""
    from harness.golden_policy import DEFAULT, GoldenPolicy

    if config.getoption("xfalign_update"):
        return GoldenPolicy.FORCE_REGEN
    chosen = config.getoption("xfalign_golden")
    return GoldenPolicy(chosen) if chosen is not None else DEFAULT


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """--xfalign-warn-unused: the goldens in the baseline folders used that no item of the session produced."""
    if not config.getoption("xfalign_warn_unused") or _PRODUCED not in config.stash:
        return
    from harness.reports.text import unused_golden_text, warning_line
    from harness.store.golden import unused_goldens

    for folder, names in config.stash[_PRODUCED].items():
        for path in unused_goldens(folder, names):
            terminalreporter.write_line(warning_line(unused_golden_text(path)))


def _command_line(config) -> list[Path]:
    """The paths pytest was asked to collect: named on the command line, or the invocation folder (but not
    `testpaths`, which a plain `pytest` collects: there only xfalign_cases counts)."""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return []
    base = config.invocation_params.dir
    return [(base / arg.split("::")[0]).resolve() for arg in config.args]


def _under(path: Path, roots) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _looks_like_case(path: Path) -> bool:
    """A YAML file is a case when its top level has `op`, or two of op/sides/inputs; one that does not parse
    counts when its text has such top-level keys (a broken case must be reported, not skipped)."""
    import yaml

    try:
        with open(path, "rb") as file:
            raw = file.read(_SNIFF_BYTES + 1)
    except OSError:
        return False
    text = raw.decode("utf-8", errors="replace")
    keys: set = set()
    if len(raw) <= _SNIFF_BYTES:
        try:
            data = yaml.safe_load(text)
            keys = set(data) if isinstance(data, dict) else set()
        except (yaml.YAMLError, RecursionError, TypeError):
            keys = set(_TOP_LEVEL_KEY.findall(text))
    else:
        keys = set(_TOP_LEVEL_KEY.findall(text))
    return "op" in keys or len(CASE_KEYS & keys) >= 2


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix not in (".yaml", ".yml") or file_path.name.endswith(GOLDEN_SUFFIXES):
        return None  # goldens have sides and inputs too, but are not cases
    config = parent.config
    path = file_path.resolve()
    named = _command_line(config)
    if path in named or path in _configured(config):
        return CaseFile.from_parent(parent, path=file_path)  # named explicitly: a case, loadable or not
    if (_under(path, named) or _under(path, _configured(config))) and _looks_like_case(file_path):
        return CaseFile.from_parent(parent, path=file_path)
    return None


def _session_pool(config):
    """One set of long-lived workers for the whole pytest session (each framework imported once), made
    when the first case runs and closed when pytest ends; a default pool already active is used as is."""
    from harness.runner import WorkerPool, current_pool

    if current_pool() is not None:
        return current_pool()
    if _POOL not in config.stash:
        config.stash[_POOL] = pool = WorkerPool(jobs=1)  # pytest runs items one at a time
        config.add_cleanup(pool.close)
    return config.stash[_POOL]


def _session_profiles(config):
    from harness.numerics import Profiles

    if _PROFILES not in config.stash:
        config.stash[_PROFILES] = Profiles()
    return config.stash[_PROFILES]


def _session_options(config):
    """The session's run options, made when the first case runs (a --xfalign-numerics profile that does not
    load fails each case)."""
    from harness.run_options import RunOptions

    if _OPTIONS not in config.stash:
        config.stash[_OPTIONS] = RunOptions(repeat=config.getoption("xfalign_repeat"),
                                            numerics=config.getoption("xfalign_numerics"),
                                            profiles=_session_profiles(config))
    return config.stash[_OPTIONS]


class CaseFile(pytest.File):
    def collect(self):
        from harness.case import CaseError
        from harness.load import load_cases

        try:
            cases = load_cases(self.path, _session_profiles(self.config))
        except CaseError as error:  # one failing item with the one-line message; other files still run
            yield BrokenCase.from_parent(self, name=self.path.name, message=str(error))
            return
        for case in cases:  # one item per sweep point
            yield CaseItem.from_parent(self, name=case.name, case=case)


class BrokenCase(pytest.Item):
    """A case file that does not load: it fails with its one-line message."""

    def __init__(self, *, message: str, **kwargs):
        super().__init__(**kwargs)
        self.message = message

    def runtest(self):
        raise CaseFailed(self.message)

    def repr_failure(self, excinfo, style=None):
        return self.message

    def reportinfo(self):
        return self.path, None, f"xfalign case file {self.path.name}"


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self):
        from rich.console import Console

        from harness.case import CaseError
        from harness.errors import SideCrashed
        from harness.gate import check, settle
        from harness.reports.terminal import print_comparison, print_gate_result
        from harness.reports.text import golden_written_text, status_label, verdict_text
        from harness.runner import run_case
        from harness.store.dump import DumpError
        from harness.store.golden import Golden, GoldenMismatch, baseline_dir

        config = self.config
        try:
            run = run_case(self.case, options=_session_options(config), pool=_session_pool(config))
        except SideCrashed as error:
            raise CaseFailed(f"side crashed: {error}") from None
        except CaseError as error:  # e.g. inputs over the size limit
            raise CaseFailed(str(error)) from None
        comparison = run.comparison
        assert comparison is not None  # both sides ran (run_case runs every side of the case)
        if comparison.status == "n/a":  # a side cannot run here: nothing to check, nothing failed
            pytest.skip(f"{status_label('n/a')} {verdict_text(comparison)}")
        buffer = io.StringIO()
        console = Console(file=buffer, width=160, color_system=None)
        print_comparison(comparison, console)
        baseline = config.getoption("xfalign_baseline")
        passed = comparison.passed
        if baseline is not None:
            policy = _policy(config)
            folder = baseline_dir(baseline, run.environment_class)
            config.stash.setdefault(_PRODUCED, {}).setdefault(folder, []).append(run.case_name)
            try:
                golden = Golden.read(folder, run.case_name)
            except (DumpError, GoldenMismatch) as error:
                if not policy.rewrites_unreadable or isinstance(error, GoldenMismatch):
                    raise CaseFailed(str(error)) from None
                golden = None  # unreadable: rewritten
            result = settle(policy, folder, run.case_name, golden, Golden.from_run(run), lambda g: check(run, g), [])
            if result.update is not None:  # written now: a missing one fails once, as in pytest-regressions
                console.print(golden_written_text(run.case_name, result.update, folder, not policy.passes_written),
                              markup=False)
            print_gate_result(result, console)
            passed = result.passed
        if not passed:
            raise CaseFailed(buffer.getvalue())

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"xfalign case {self.name}"
