"""pytest plugin: `pytest cases/` collects each YAML case as a test item.

A failing item shows the per-tensor table and every problem; with `--xfalign-baseline DIR` the goldens
are checked too (update them with `xfalign gate CASES --baseline DIR --update`).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from harness.case import CaseError, load_cases
from harness.gate import Golden, baseline_dir, check
from harness.reports.terminal import print_comparison, print_gate_result
from harness.reports.text import status_label, verdict_text
from harness.runner import SideFailed, run_case

CASE_KEYS = {"op", "sides", "inputs"}


class CaseFailed(Exception):
    """The case's checks failed; the message is the report to show."""


def pytest_addoption(parser):
    group = parser.getgroup("xfalign")
    group.addoption("--xfalign-baseline", type=Path, help="check goldens in this folder (DIR/<environment class>/) too")
    group.addoption("--xfalign-numerics", help="numerics profile for every case (default: the case's, else portable-avx2)")
    group.addoption("--xfalign-repeat", type=int, default=1, help="run each side N times (nondeterminism)")


def _is_case_file(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and CASE_KEYS <= data.keys()


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix in (".yaml", ".yml") and _is_case_file(file_path):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    def collect(self):
        try:
            cases = load_cases(self.path)
        except CaseError as error:
            raise self.CollectError(str(error)) from None
        for case in cases:  # one item per sweep point
            yield CaseItem.from_parent(self, name=case.name, case=case)


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self):
        config = self.config
        if any(self.case.device_of(side) == "cuda" for side in self.case.sides) and not Path("/dev/nvidia0").exists():
            pytest.skip("a side of this case runs on cuda and this machine has no NVIDIA GPU")
        try:
            run = run_case(self.case, repeat=config.getoption("xfalign_repeat"),
                           numerics=config.getoption("xfalign_numerics"))
        except SideFailed as error:
            raise CaseFailed(f"side crashed: {error}") from None
        if run.comparison.status == "n/a":  # a side cannot run here: nothing to check, nothing failed
            pytest.skip(f"{status_label('n/a')} {verdict_text(run.comparison)}")
        buffer = io.StringIO()
        console = Console(file=buffer, width=160, color_system=None)
        print_comparison(run.comparison, console)
        baseline = config.getoption("xfalign_baseline")
        passed = run.comparison.passed
        if baseline is not None:
            result = check(run, Golden.read(baseline_dir(baseline, run.environment_class), run.case_id))
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
