"""The float64 reference as arbiter: expectation kinds against it, its N/A paths, and its words."""

import math

import ml_dtypes
import numpy as np
import pytest

from harness.case import REFERENCE_SIDE, ExpectSpec
from harness.compare.case import InputMismatch, compare_dumps
from harness.compare.findings import ExactErrorOverBound, WorseThan
from harness.reports.text import closer_text, finding_text, reference_text, to_exact_text
from harness.rounding import round_float64
from harness.store.dump import Dump

from report_fixtures import dumps_of, side_meta

BF16 = ml_dtypes.bfloat16


def _exact_dump(tensors: dict, inputs: dict) -> Dump:
    meta = side_meta(REFERENCE_SIDE, "megatron", inputs)
    return Dump(meta | {"impl": "float64 reference"}, tensors)


def three_dumps(ulps_b: int = 3, at: int = 5, n: int = 256, seed: int = 0):
    """exact: float64 values; A: exact rounded once to bf16 (correctly rounded); B: A with one element `ulps_b` ULP off."""
    x = np.random.default_rng(seed).standard_normal(n) * 4
    a = round_float64(x, "bfloat16")
    b = a.copy()
    b.view(np.uint16)[at] += ulps_b
    inputs = {"x": np.zeros(2, np.float32)}
    da, db = dumps_of({"out": a}, {"out": b})
    return da, db, _exact_dump({"out": x}, inputs)


def judge(expectation, ulps_b=3, exact=True):
    a, b, x = three_dumps(ulps_b)
    result = compare_dumps(a, b, ExpectSpec(tensors={"out": expectation}), x if exact else None).tensors[0]
    return result


def test_a_correctly_rounded_side_is_0_ulp_from_exact_and_the_other_side_its_offset():
    pair = judge("report").pair
    assert pair.exact.a.max_ulp == 0 and pair.exact.b.max_ulp == 3
    assert pair.exact.a.normwise_u <= 1  # the correctly rounded side: within one unit roundoff, normwise
    assert pair.exact.closeness.a_closer == 1 and pair.exact.closeness.b_closer == 0
    assert closer_text(pair) == "A 1" and to_exact_text(pair).startswith("0/")


@pytest.mark.parametrize(("expectation", "holds"), [
    ({"max_ulp_to_exact": 3}, True),
    ({"max_ulp_to_exact": 2}, False),
    ({"max_ulp_to_exact": {"megatron": 0}}, True),  # only A bounded
    ({"max_ulp_to_exact": {"megatron": 0, "paddle": 2}}, False),
    ({"max_normwise_to_exact": 100}, True),
    ({"max_normwise_to_exact": {"megatron": 1}}, True),
    ({"max_normwise_to_exact": 0.01}, False),
    ({"no_worse_than": "paddle"}, True),  # A (correctly rounded) is no worse than B
    ({"no_worse_than": "megatron"}, False),  # B is worse than A
    ({"no_worse_than": {"side": "megatron", "factor": 1.5}}, True),  # B's one extra error is within the factor
    ({"no_worse_than": {"side": "megatron", "factor": 1.001}}, False),
    (["bitwise", {"max_ulp_to_exact": 3}], False),  # the sides differ: bitwise fails
    ([{"max_ulp": 3}, {"max_ulp_to_exact": 3}], True),
    ([{"max_ulp": 3}, {"no_worse_than": "megatron"}], False),
])
def test_each_kind_judges_the_sides_against_exact(expectation, holds):
    assert judge(expectation).holds is holds


def test_an_exact_only_expectation_reports_the_sides_differences_without_judging_them():
    result = judge({"max_ulp_to_exact": 3})
    assert result.holds and [f.kind for f in result.findings] == ["float-values"] and result.findings[0].passed


def test_failing_findings_name_the_side_and_the_bound():
    result = judge({"max_ulp_to_exact": 1})
    [failure] = result.failures
    assert isinstance(failure.data, ExactErrorOverBound) and failure.data.side == "paddle"
    assert finding_text(failure) == "out: expected max_ulp_to_exact 1, but side paddle is 3 ULP from exact (bound 1 ULP)"
    [worse] = judge({"no_worse_than": "megatron"}).failures
    assert isinstance(worse.data, WorseThan) and worse.data.side == "paddle" and worse.data.than == "megatron"
    assert finding_text(worse).startswith("out: expected no_worse_than megatron, but side paddle is 0.44")
    assert "more than side megatron's 0.43" in finding_text(worse)


def test_without_a_reference_an_exact_bound_fails_as_unmeasured_and_says_why():
    result = judge({"max_ulp_to_exact": 100}, exact=False)
    [failure] = result.failures
    assert failure.kind == "no-reference" and "no float64 reference was given" in finding_text(failure)
    a, b, _ = three_dumps()
    comparison = compare_dumps(a, b, ExpectSpec(all="report"), None, "the op family declares none")
    assert comparison.reference is None and reference_text(comparison) == "exact: n/a (the op family declares none)"
    assert to_exact_text(comparison.tensors[0].pair) == "n/a" and comparison.passed


def test_a_reference_with_other_inputs_or_of_a_side_is_refused():
    a, b, x = three_dumps()
    x.meta["inputs"] = {"x": x.meta["inputs"]["x"] | {"md5": "0" * 32}}
    with pytest.raises(InputMismatch, match="not made from the inputs"):
        compare_dumps(a, b, None, x)
    with pytest.raises(InputMismatch, match="side 'paddle''s, not a reference's"):
        compare_dumps(a, b, None, b)


def test_nan_and_inf_against_exact_fail_a_bound_and_integers_are_not_measured():
    a, b, x = three_dumps()
    b.tensors["out"].view(np.uint16)[7] = 0x7FC0  # NaN where exact is finite
    result = compare_dumps(a, b, ExpectSpec(tensors={"out": {"max_normwise_to_exact": 1e9}}), x).tensors[0]
    assert result.pair.exact.b.class_mismatch == 1 and [f.kind for f in result.failures] == ["exact-error"]
    inputs = {"x": np.zeros(2, np.float32)}
    ints = np.arange(4, dtype=np.int64)
    da, db = dumps_of({"idx": ints}, {"idx": ints.copy()})
    dx = _exact_dump({"idx": ints.copy()}, inputs)
    result = compare_dumps(da, db, ExpectSpec(tensors={"idx": {"max_ulp_to_exact": 0}}), dx).tensors[0]
    assert result.pair.exact.missing == "not-float"
    assert [f.kind for f in result.failures] == ["no-reference"]


def test_normwise_of_an_all_zero_reference_holds_only_for_zeros():
    inputs = {"x": np.zeros(2, np.float32)}
    zeros = np.zeros(8, np.float32)
    off = zeros.copy()
    off[3] = 1e-30
    da, db = dumps_of({"g": zeros}, {"g": off})
    result = compare_dumps(da, db, ExpectSpec(tensors={"g": {"max_normwise_to_exact": 1e6}}),
                           _exact_dump({"g": np.zeros(8)}, inputs)).tensors[0]
    assert result.pair.exact.a.normwise_absolute and [f.data.side for f in result.failures] == ["paddle"]
    assert not math.isnan(result.pair.exact.b.normwise)


def test_an_expectation_naming_an_unknown_side_is_one_line_naming_file_line_field(write_case):
    from harness.case import CaseError
    from harness.load import load_cases

    path = write_case("""
        op: swiglu
        inputs:
          x: {shape: [4, 8], dtype: bfloat16}
          grad_out: {shape: [4, 4], dtype: bfloat16}
        sides:
          megatron: {framework: megatron, impl: megatron}
          paddle: {framework: paddle, impl: fp32_island}
        expect:
          tensors:
            out: [{max_ulp: 1}, {no_worse_than: torch}]
        """)
    with pytest.raises(CaseError) as error:
        load_cases(path)
    message = str(error.value)
    assert len(message.splitlines()) == 1 and f"{path}:" in message and "torch" in message and "expect.tensors.out" in message
    path.write_text(path.read_text().replace("paddle: {", "exact: {").replace("torch", "megatron"))
    with pytest.raises(CaseError, match="'exact' names the float64 reference"):
        load_cases(path)


def test_reports_show_each_side_against_exact(tmp_path):
    import json

    from rich.console import Console

    from harness.reports.html import write_reports
    from harness.reports.json_report import write_json
    from harness.reports.terminal import print_comparison

    a, b, x = three_dumps()
    comparison = compare_dumps(a, b, ExpectSpec(all={"max_ulp_to_exact": 1}), x)
    data = json.loads(write_json([comparison], tmp_path / "r.json").read_text())
    [tensor] = data["cases"][0]["tensors"]
    assert tensor["to_exact"]["a"]["max_ulp"] == 0 and tensor["to_exact"]["b"]["max_ulp"] == 3
    assert tensor["to_exact"]["closeness"]["a_closer"] == 1 and tensor["closer"] == "A 1"
    assert data["cases"][0]["reference"]["name"] == REFERENCE_SIDE and data["cases"][0]["reference_missing"] is None
    write_reports([comparison], tmp_path / "html")
    html = next((tmp_path / "html").glob("known_diff*.html")).read_text()
    assert "Against the exact result" in html and "Closer to exact, element by element: A in 1 (0.4%)" in html
    console = Console(width=250, record=True)
    print_comparison(comparison, console)
    text = console.export_text()
    assert "exact: the float64 reference, run eagerly on the CPU by the megatron worker" in text
    assert "0/0.43 | 3/0.44" in text and "side paddle is 3 ULP from exact (bound 1 ULP)" in text


def test_identical_sides_are_measured_once_with_the_same_result():
    from harness.compare.arbiter import arbitrate

    a, _, x = three_dumps()
    values, exact = a.tensors["out"], x.tensors["out"]
    assert arbitrate(values, values.copy(), exact, ("A", "B"), identical=True) == \
        arbitrate(values, values.copy(), exact, ("A", "B"))
