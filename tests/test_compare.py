"""The comparison layer: one Pair type per kind, expectations as objects, one Finding type, text in one place."""

import ast
import io
import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from pydantic import ValidationError
from rich.console import Console

import harness
from harness.case import ExpectSpec
from harness.compare.case import CaseComparison, compare_dumps
from harness.compare.expectations import KINDS, Bitwise, MaxAbs, MaxUlp, Report
from harness.compare.findings import EnvironmentChanged, Finding, Missing
from harness.compare.pairs import (
    ExactPair,
    FloatPair,
    MismatchedPair,
    OneSidedPair,
    originate,
)
from harness.reports.html import write_reports
from harness.reports.json_report import write_json
from harness.reports.terminal import print_comparison
from harness.reports.text import finding_text, findings_lines

from report_fixtures import dumps_of, known_diff_dumps

HARNESS = Path(harness.__file__).resolve().parent


def one_ulp_apart(n=4, at=(2,), ulps=1):
    a = np.linspace(1, 2, n, dtype=np.float32)
    b = a.copy()
    b.view(np.uint32)[list(at)] += ulps
    return a, b


# -- one Pair per kind, each with its findings


def test_originate_picks_the_pair_kind():
    a, b = one_ulp_apart()
    assert type(originate("t", a, b)) is FloatPair
    assert type(originate("t", np.array([True]), np.array([False]))) is ExactPair
    assert type(originate("t", np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32))) is ExactPair
    assert type(originate("t", a, None)) is OneSidedPair
    assert type(originate("t", a, a.astype(ml_dtypes.bfloat16))) is MismatchedPair
    assert type(originate("t", a, a.reshape(2, 2))) is MismatchedPair


def test_float_pair_findings():
    a, b = one_ulp_apart(ulps=3)
    b[0] = -0.0 if a[0] == 0 else b[0]
    pair = originate("out", a, b)
    assert not pair.bitwise and pair.measured
    (finding,) = pair.compare()
    assert (finding.kind, finding.tensor, finding.passed) == ("float-values", "out", False)
    assert finding.data.differing == 1 and finding.data.max_ulp == 3 and finding.data.max_ulp_flat_index == 2
    assert originate("out", a, a.copy()).compare() == []


def test_float_pair_nan_inf_classes_have_no_distance():
    a = np.array([1.0, 2.0], np.float32)
    b = np.array([np.nan, np.inf], np.float32)
    pair = originate("out", a, b)
    (finding,) = pair.compare()
    assert not pair.measured and finding.data.max_ulp is None and finding.data.max_abs is None
    assert (finding.data.nan_mismatch, finding.data.inf_mismatch) == (1, 1)
    assert "ULP" not in finding_text(finding) and "1 NaN and 1 Inf mismatches" in finding_text(finding)


def test_exact_pair_findings():
    a = np.array([True, False, True, False])
    pair = originate("routing.map", a, ~a)
    (finding,) = pair.compare()
    assert (finding.kind, finding.data.differing, finding.data.elements) == ("exact-values", 4, 4)
    assert finding_text(finding) == "routing.map: 4 of 4 elements differ"


def test_one_sided_and_mismatched_pair_findings():
    a = np.arange(8, dtype=np.float32)
    (missing,) = originate("grad.bias", a, None).compare()
    assert (missing.kind, missing.data) == ("missing", Missing(side="B")) and missing.to_json()["data"] == {"side": "B"}
    (dtype,) = originate("x", a, a.astype(ml_dtypes.bfloat16)).compare()
    assert finding_text(dtype) == "x: dtype differs: float32 vs bfloat16"
    flattened = originate("grad.probs", a, a.reshape(8, 1))
    assert flattened.values.stats.bitwise_equal and not flattened.bitwise
    (shape,) = flattened.compare()
    assert finding_text(shape) == "grad.probs: shape differs: [8] vs [8, 1]; values compared flattened"
    b = a.reshape(8, 1).copy()
    b[3] += 1
    kinds = [f.kind for f in originate("grad.probs", a, b).compare()]
    assert kinds == ["shape", "float-values"]  # the values, compared flattened, are a finding too


# -- expectations: objects with check() and describe(), parsed from the YAML forms


def test_yaml_forms_parse_to_expectation_objects():
    spec = ExpectSpec(all="bitwise", tensors={"a": "report", "b": {"max_ulp": 2}, "c": {"max_abs": "1e-3"}})
    assert spec.for_tensor("z") == Bitwise() and spec.for_tensor("a") == Report()
    assert spec.for_tensor("b") == MaxUlp(max_ulp=2) and spec.for_tensor("c") == MaxAbs(max_abs=0.001)
    assert [spec.for_tensor(n).describe() for n in "zabc"] == ["bitwise", "report", "max_ulp 2", "max_abs 0.001"]
    # back to the same YAML forms (a dump records its case as JSON, and compare reads it back)
    assert spec.model_dump(mode="json") == {"all": "bitwise", "tensors": {"a": "report", "b": {"max_ulp": 2},
                                                                          "c": {"max_abs": 0.001}}}
    assert ExpectSpec(**spec.model_dump(mode="json")) == spec
    assert list(KINDS) == ["bitwise", "report", "max_ulp", "max_abs", "max_ulp_to_exact", "max_normwise_to_exact",
                           "no_worse_than"]


@pytest.mark.parametrize("value, words", [("exact", "an expectation is bitwise, report, {max_ulp: N}, {max_abs: N}, {max_ulp_to_exact: N}, "
                                                    "{max_normwise_to_exact: N}, {no_worse_than: N} or [...]"),
                                          ({"max_ulp": 1, "max_abs": 1}, "an expectation is"),
                                          ({"max_abs": True}, "not a boolean"),
                                          ({"max_abs": -1.0}, "greater than or equal to 0"),
                                          ({"max_abs": float("inf")}, "finite number")])
def test_bad_expectations_are_refused(value, words):
    with pytest.raises(ValidationError) as info:
        ExpectSpec(all=value)
    assert words in str(info.value)


def test_bad_expectation_in_a_case_file_is_one_line_naming_file_line_field(write_case):
    from harness.case import CaseError
    from harness.load import load_cases

    from conftest import CASE

    path = write_case(CASE.replace("all: bitwise", "all: bitwise\n  tensors: {out: {max_abs: -1}}"))
    with pytest.raises(CaseError) as info:
        load_cases(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: expect\.tensors\.out\.max_abs: .*greater than or equal to 0.*",
                        str(info.value))


def test_max_ulp_boundaries_and_nan_never_within():
    a, b = one_ulp_apart(ulps=3)
    assert all(f.passed for f in MaxUlp(max_ulp=3).check(originate("t", a, b)))
    (failing,) = MaxUlp(max_ulp=2).check(originate("t", a, b))
    assert not failing.passed and failing.expected == "max_ulp 2"
    assert finding_text(failing).startswith("t: expected max_ulp 2, but 1 of 4 elements differ, max 3 ULP")
    b[0] = np.nan
    assert not any(f.passed for f in MaxUlp(max_ulp=100).check(originate("t", a, b)))


def test_max_abs():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = a + np.float32(0.25)
    assert all(f.passed for f in MaxAbs(max_abs=0.25).check(originate("t", a, b)))
    (failing,) = MaxAbs(max_abs=0.1).check(originate("t", a, b))
    assert not failing.passed and "expected max_abs 0.1, but 3 of 3 elements differ" in finding_text(failing)
    b[1] = np.inf
    assert not any(f.passed for f in MaxAbs(max_abs=1e30).check(originate("t", a, b)))
    comparison = compare_dumps(*dumps_of({"out": a}, {"out": a + np.float32(0.25)}),
                               ExpectSpec(all={"max_abs": "0.5"}))
    assert comparison.status == "pass"


@pytest.mark.parametrize("expectation", [MaxUlp(max_ulp=1_000_000), MaxAbs(max_abs=1e30)])
@pytest.mark.parametrize("a", [np.array([True, False, True, False]), np.array([1, 2, 3, 4], np.int32)])
def test_a_tolerance_on_exact_values_never_passes(a, expectation):
    """The old comparator passed max_ulp on bool tensors that differ everywhere: now it cannot pass at all."""
    differ = ~a if a.dtype == bool else a + 1
    for b in (differ, a.copy()):  # even equal values: a ULP bound on bools is a mistake in the case
        findings = expectation.check(originate("routing.map", a, b))
        assert findings and not any(f.passed for f in findings)
        assert findings[0].kind == "not-applicable"
        text = finding_text(findings[0])
        assert f"does not apply to {a.dtype} values" in text and "expect bitwise" in text
    comparison = compare_dumps(*dumps_of({"routing.map": a}, {"routing.map": differ}), ExpectSpec(all=expectation))
    assert comparison.status == "fail"
    assert all(f.passed for f in Bitwise().check(originate("routing.map", a, a.copy()))) is True


def test_report_shows_differences_and_never_fails():
    a, b = one_ulp_apart()
    (finding,) = Report().check(originate("t", a, b))
    assert finding.passed and finding.expected == "report"
    assert Report().check(originate("t", a, None))[0].passed


# -- one Finding type through terminal, JSON, HTML and the gate


def test_one_finding_flows_to_terminal_json_and_html(tmp_path):
    comparison = compare_dumps(*known_diff_dumps(rows=16, cols=16))  # expect: bitwise
    failures = [f for result in comparison.tensors for f in result.findings if not f.passed]
    assert failures and all(isinstance(f, Finding) for f in failures)
    lines = findings_lines(failures)

    out = Console(file=io.StringIO(), width=400, color_system=None)
    print_comparison(comparison, out)
    verdict = out.file.getvalue().splitlines()[-1]
    assert all(line in verdict for line in lines)

    data = json.loads(write_json([comparison], tmp_path / "r.json").read_text())
    assert data["format"] == "xfalign-report/2"
    tensors = {t["name"]: t for t in data["cases"][0]["tensors"]}
    out_finding = tensors["out"]["findings"][0]
    assert out_finding["kind"] == "float-values" and out_finding["passed"] is False
    assert out_finding["text"] == finding_text(failures[0]) and out_finding["data"]["max_ulp"] == 1
    assert tensors["out"]["pair"] == "FloatPair" and tensors["grad.x"]["findings"] == []

    html = write_reports([comparison], tmp_path / "r.html").read_text()
    assert lines[0].replace("'", "&#39;") in html


def test_gate_results_are_findings(tmp_path):
    from harness.case import Case
    from harness.gate import GateResult, check
    from harness.reports.terminal import print_gate_result
    from harness.runner import CaseRun
    from harness.store.golden import Golden

    a, b = known_diff_dumps(rows=16, cols=16)
    for dump in (a, b):
        dump.meta["repeats"] = {"grad.x": ["m1", "m2"]}  # nondeterministic there
    run = CaseRun(Case.model_construct(name="known_diff"), {"megatron": a, "paddle": b}, compare_dumps(a, b), "cpu-avx2")
    result = check(run, None)
    assert isinstance(result, GateResult) and all(isinstance(f, Finding) for f in result.findings)
    assert [f.kind for f in result.failures] == ["nondeterministic", "nondeterministic", "float-values", "float-values",
                                                 "no-golden"]
    expectation_failures = [f for f in run.comparison.findings if not f.passed]
    assert [f for f in result.failures if f.kind == "float-values"] == expectation_failures  # the very same

    golden = Golden.from_run(run)
    golden.write(tmp_path)
    golden = Golden.read(tmp_path, "known_diff")
    golden.environment["paddle"]["device_name"] = "elsewhere"
    changed = b.tensors["out"].copy()
    changed.view(np.uint16)[0, 0] ^= 1
    b.tensors["out"] = changed
    b.meta.pop("tensors", None)
    run = CaseRun(run.case, {"megatron": a, "paddle": b}, compare_dumps(a, b), "cpu-avx2")
    result = check(run, golden)
    drift = [f for f in result.failures if f.expected == "golden"]
    assert [(f.kind, f.tensor) for f in drift] == [("float-values", "paddle/out")]
    (environment,) = [f for f in result.findings if f.kind == "environment"]
    assert environment.passed and environment.data == EnvironmentChanged(field="device_name", golden="elsewhere", now="cpu")
    out = Console(file=io.StringIO(), width=400, color_system=None)
    print_gate_result(result, out)
    text = out.file.getvalue()
    assert "[drift] paddle/out: drifted from the golden: 1 of 256 elements differ, max " in text
    assert "environment changed since the golden: paddle: device name elsewhere → cpu" in text


# -- the words live in reports/text.py only

PROSE = re.compile(r"[A-Za-z]{2,} [A-Za-z]{2,}")  # two words in a row
RICH_STYLE = re.compile(r"^(bold |dim )?(green|red|yellow)$")
NO_PROSE = [HARNESS / "gate.py", *sorted((HARNESS / "compare").glob("*.py")),
            *[p for p in sorted((HARNESS / "reports").glob("*.py")) if p.name != "text.py"]]


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _strings(tree: ast.AST, skipped: set[int]) -> list[ast.Constant]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skipped]


def _prose_outside_errors(path: Path) -> list[str]:
    """String literals with words in them, other than docstrings and the messages of raised errors."""
    tree = ast.parse(path.read_text())
    raised = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Raise) for n in ast.walk(node)}
    return [f"{path.name}:{node.lineno}: {node.value!r}" for node in _strings(tree, raised | _docstrings(tree))
            if PROSE.search(node.value) and not RICH_STYLE.match(node.value)]


@pytest.mark.parametrize("path", NO_PROSE, ids=lambda p: p.name)
def test_no_result_text_outside_reports_text(path):
    assert _prose_outside_errors(path) == []


@pytest.mark.parametrize("path", NO_PROSE, ids=lambda p: p.name)
def test_no_framework_names_in_generic_modules(path):
    """Not in names, imports or strings (a docstring may say where an idea comes from)."""
    tree = ast.parse(path.read_text())
    words = [node.value for node in _strings(tree, _docstrings(tree))]
    words += [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
    words += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    words += [alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
              for alias in node.names] + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [word for word in words if re.search(r"megatron|paddle|torch", word, re.IGNORECASE)]


def test_reports_show_the_versions_a_fingerprint_records(tmp_path):
    """Made from the fingerprint's version fields by the side's framework adapter; an old dump's version_line
    (no longer recorded) is neither shown nor a fingerprint row."""
    a, b = known_diff_dumps(rows=16, cols=16)
    a.meta["environment"] |= {"torch": "1.2.3", "megatron_core": "0.16.1", "version_line": "torch 0.0.1"}
    b.meta["environment"] |= {"paddle": "3.0.0"}
    comparison = compare_dumps(a, b)
    out = Console(file=io.StringIO(), width=400, color_system=None)
    print_comparison(comparison, out)
    text = out.file.getvalue()
    assert "A megatron: fixture on cpu; torch 1.2.3, megatron-core 0.16.1" in text and "B paddle: " in text
    assert "; paddle 3.0.0" in text and "torch 0.0.1" not in text
    html = write_reports([comparison], tmp_path / "r.html").read_text()
    assert "<div>torch 1.2.3, megatron-core 0.16.1</div>" in html and "<div>paddle 3.0.0</div>" in html
    assert "version_line" not in html and "torch 0.0.1" not in html


def test_case_comparison_status_and_first_divergent():
    comparison = compare_dumps(*known_diff_dumps(rows=16, cols=16), ExpectSpec(all="report"))
    assert isinstance(comparison, CaseComparison) and comparison.status == "pass" and comparison.passed
    assert comparison.first_divergent.name == "out" and comparison.failing == []


def test_digests_that_disagree_with_equal_values_are_a_finding():
    from harness.store.digest import Digest

    a = np.ones(4, np.float32)
    other = Digest("float32", (4,), "0" * 32)
    (finding,) = originate("t", a, a.copy(), (Digest.of(a), other)).compare()
    assert finding.kind == "digest" and not finding.passed
    assert finding_text(finding).endswith(", yet every element is equal")
