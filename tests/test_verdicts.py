"""Verdicts and their text: N/A, exact dtypes, NaN/Inf classes, strict JSON, literal paths, worker
imports and provenance, nondeterminism of a single side."""

import argparse
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import harness
from harness.case import ExpectSpec
from harness.compare.case import compare_dumps
from harness.compare.expectations import MaxUlp
from harness.compare.pairs import originate
from harness.load import load_cases
from harness.reports.html import write_reports
from harness.reports.json_report import write_json
from harness.reports.terminal import print_comparison
from harness.reports.text import detail_text, findings_lines
from harness.store.dump import Dump

from report_fixtures import dumps_of, known_diff_dumps

HARNESS_DIR = Path(harness.__file__).resolve().parent

TINY_PADDLE_PAIR = """\
op: swiglu
seed: 3
inputs:
  x: {shape: [4, 8], dtype: bfloat16}
  grad_out: {shape: [4, 4], dtype: bfloat16}
sides:
  island: {framework: paddle, impl: fp32_island}
  per_op: {framework: paddle, impl: per_op_rounding}
expect:
  all: report
"""

# Paddle's fused_linear is GPU only: on this machine the case is N/A, not a crash.
TINY_NOT_AVAILABLE = """\
op: linear
vars: {rows: 2, in_features: 8, out_features: 4}
options: {bias: true}
seed: 3
inputs:
  x: {shape: [rows, in_features], dtype: bfloat16}
  weight: {shape: [out_features, in_features], dtype: bfloat16, std: 0.05}
  bias: {shape: [out_features], dtype: bfloat16}
  grad_out: {shape: [rows, out_features], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: fused_linear}
expect:
  all: bitwise
"""


def console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


def printed(comparison) -> str:
    out = console()
    print_comparison(comparison, out)
    return out.file.getvalue()


def table_row(text: str, name: str, bar: str = "│") -> list[str]:
    """The cells of a tensor's row in the terminal table."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(bar)]
        if len(cells) > 2 and cells[1] == name:
            return cells[1:-1]
    raise AssertionError(f"no row {name!r} in:\n{text}")


def table_header(text: str) -> list[str]:
    return table_row(text, "tensor", "┃")


def unavailable_dumps(reason: str = "fused_linear is not available on cpu") -> tuple[Dump, Dump]:
    """What worker.py writes for a side that cannot run here, and a side that ran."""
    a, b = known_diff_dumps(rows=16, cols=16)
    b = Dump(b.meta | {"provenance": "-", "environment": {}, "inputs": {}, "unavailable": reason}, {})
    return a, b


def strict_json(path: Path):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(path.read_text(), parse_constant=refuse)


# 1. max_ulp on integer and bool tensors never holds: it says so, and shows no ULP numbers


@pytest.mark.parametrize("a", [np.array([True, False, True, False]), np.array([1, 2, 3, 4], dtype=np.int32)])
def test_max_ulp_on_exact_dtypes_never_holds(a):
    b = ~a if a.dtype == bool else a + 1
    findings = MaxUlp(max_ulp=4).check(originate("routing.map", a, b))
    assert not any(f.passed for f in findings)
    (text,) = findings_lines(findings)
    assert text == (f"routing.map: expected max_ulp 4, but max_ulp 4 does not apply to {a.dtype} values, which are "
                    "equal or not (expect bitwise); 4 of 4 elements differ")
    assert not any(f.passed for f in MaxUlp(max_ulp=4).check(originate("routing.map", a, a.copy())))

    comparison = compare_dumps(*dumps_of({"routing.map": a}, {"routing.map": b}), ExpectSpec(all=MaxUlp(max_ulp=4)))
    assert comparison.status == "fail"
    text = printed(comparison)
    row = dict(zip(table_header(text), table_row(text, "routing.map")))
    assert row["max ULP"] == "-" and row["holds"] == "NO" and row["expect"] == "max_ulp 4"
    assert "does not apply" in text.split("FAIL", 1)[1]  # the verdict line


# 2. N/A is N/A everywhere


def test_unavailable_is_na_in_terminal_json_and_html(tmp_path):
    comparison = compare_dumps(*unavailable_dumps())
    assert comparison.status == "n/a"
    text = printed(comparison)
    assert "N/A known_diff" in text and "fused_linear is not available on cpu" in text and "PASS" not in text

    data = strict_json(write_json([comparison], tmp_path / "r.json"))
    case = data["cases"][0]
    assert case["status"] == "n/a" and "fused_linear is not available on cpu" in case["reason"]

    html = write_reports([comparison], tmp_path / "na.html").read_text()
    assert "N/A" in html and "fused_linear is not available on cpu" in html
    assert "PASS" not in html and "every tensor is bitwise equal" not in html.lower()
    assert "every expectation holds" not in html.lower()

    passing = compare_dumps(*known_diff_dumps(rows=16, cols=16), ExpectSpec(all="report"))
    passing.case_name = "passing"
    index = write_reports([comparison, passing], tmp_path / "several").read_text()
    verdicts = re.findall(r'<span class="verdict [^"]*"[^>]*>([^<]*)</span>', index)
    assert verdicts == ["N/A", "PASS"]


def test_unavailable_dumps_compare_exits_0_with_na(tmp_path, capsys):
    from harness.cli import main

    a, b = unavailable_dumps()
    a.write(tmp_path / "a")
    b.write(tmp_path / "b")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--html", str(tmp_path / "html")]) == 0
    out = capsys.readouterr().out
    assert "N/A known_diff" in out and "PASS" not in out


def test_not_available_case_is_a_pytest_skip_with_its_reason(pytester):
    pytester.makefile(".yaml", na=TINY_NOT_AVAILABLE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    assert "fused_linear is not available on cpu" in result.stdout.str()


# 3. NaN and Inf mismatches show whatever the expectation


@pytest.mark.parametrize("b", [np.full(4, np.inf, np.float32), np.array([-np.inf, np.inf, np.nan, np.nan], np.float32)])
def test_nan_inf_mismatches_are_not_read_as_zero(tmp_path, b):
    a = np.array([1.0, -np.inf, 2.0, 3.0], np.float32)
    comparison = compare_dumps(*dumps_of({"out": a}, {"out": b}), ExpectSpec(all="report"))
    stats = comparison.tensors[0].pair.stats
    text = printed(comparison)
    row = dict(zip(table_header(text), table_row(text, "out")))
    assert row["NaN/Inf"] == f"{stats.nan_mismatch}/{stats.inf_mismatch}" and row["NaN/Inf"] != "0/0"
    assert row["max ULP"] == "-" and row["max abs"] == "-"
    assert "max 0 ULP" not in detail_text(comparison.tensors[0].findings[0])

    case = strict_json(write_json([comparison], tmp_path / "r.json"))["cases"][0]
    tensor = case["tensors"][0]["stats"]
    assert tensor["max_ulp"] is None and tensor["max_abs"] is None
    assert (tensor["nan_mismatch"], tensor["inf_mismatch"]) == (stats.nan_mismatch, stats.inf_mismatch)

    html = write_reports([comparison], tmp_path / "r.html").read_text()
    header = re.search(r"<table id=\"tensors\">.*?</thead>", html, re.S).group(0)
    assert "NaN/Inf" in header
    body = re.search(r'<tr data-bitwise="0" data-name="out".*?</tr>', html, re.S).group(0)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>.*?</td>", body, re.S)]
    assert f"{stats.nan_mismatch}/{stats.inf_mismatch}" in cells and cells[7] == "-" and cells[8] == "-"


# 4. --json is strict, versioned JSON of one shape


def test_json_is_strict_versioned_and_one_shape(tmp_path):
    a = np.array([0.0, 1.0, 0.0, 2.0], np.float32)
    b = np.array([1.0, 1.0, -2.0, 2.0], np.float32)  # |a-b|/|a| is inf where a is 0
    comparison = compare_dumps(*dumps_of({"out": a}, {"out": b}), ExpectSpec(all="report"))
    assert comparison.tensors[0].pair.stats.max_rel == np.inf
    text = write_json([comparison], tmp_path / "one.json").read_text()
    assert "Infinity" not in text and ": NaN" not in text
    one = strict_json(tmp_path / "one.json")
    assert one["format"] == "xfalign-report/2" and len(one["cases"]) == 1
    assert one["cases"][0]["tensors"][0]["stats"]["max_rel"] == "inf"
    several = strict_json(write_json([comparison, comparison], tmp_path / "two.json"))
    assert several.keys() == one.keys() and len(several["cases"]) == 2


# 5. ±0-only and NaN-payload-only differences name their first index


def test_signed_zero_and_nan_payload_only_name_their_first_index(tmp_path):
    a = np.array([1.0, 0.0, 2.0, -0.0, 0.0, 3.0], np.float32)
    b = np.array([1.0, 0.0, 2.0, 0.0, -0.0, 3.0], np.float32)
    pair = originate("grad.x", a, b)
    assert pair.stats.signed_zero_first_index == 3
    assert "2 differ only in the sign of zero (first at flat index 3)" in detail_text(pair.compare()[0])
    assert [(w.flat_index, w.ulp) for w in pair.stats.worst] == [(3, 0), (4, 0)]

    nan_a = np.array([1.0, np.nan, 2.0, np.nan], np.float32)
    nan_b = nan_a.copy()
    nan_b.view(np.uint32)[3] ^= 1  # another NaN payload
    nan_pair = originate("out", nan_a, nan_b)
    assert nan_pair.stats.nan_payload_first_index == 3
    assert "1 differ only in NaN payload (first at flat index 3)" in detail_text(nan_pair.compare()[0])

    # many differing elements (a chunk computed whole) over several chunks: the first index is the min
    import harness.compare.metrics

    many_a = np.linspace(1, 2, 1024, dtype=np.float32)
    many_a[[300, 700]] = 0.0
    many_b = many_a.copy()
    many_b.view(np.uint32)[::3] += 1
    many_b[[300, 700]] = -0.0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness.compare.metrics, "CHUNK_ELEMENTS", 256)
        many = originate("grad.x", many_a, many_b).stats
    assert (many.signed_zero_only, many.signed_zero_first_index) == (2, 300)

    comparison = compare_dumps(*dumps_of({"grad.x": a}, {"grad.x": b}), ExpectSpec(all="report"))
    stats = strict_json(write_json([comparison], tmp_path / "r.json"))["cases"][0]["tensors"][0]["stats"]
    assert stats["signed_zero_first_index"] == 3 and stats["worst"][0]["flat_index"] == 3
    html = write_reports([comparison], tmp_path / "r.html").read_text()
    worst = re.search(r'<table class="worst">.*?</table>', html, re.S).group(0)
    assert "<td class=\"mono\">[3]</td>" in worst


# 6. Workers import the parent's xfalign; provenance names installed files and versions


def test_worker_ignores_a_harness_package_in_the_working_directory(tmp_path, write_case, monkeypatch):
    from harness.runner import WorkerPool, run_case

    fake = tmp_path / "work" / "harness"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = 'fake'\n")
    (fake / "worker.py").write_text("raise SystemExit('FAKE HARNESS WORKER RAN')\n")
    (case,) = load_cases(write_case(TINY_PADDLE_PAIR))
    monkeypatch.chdir(tmp_path / "work")
    with WorkerPool(jobs=1) as pool:  # a worker of its own, started in that folder (not the session's)
        run = run_case(case, pool=pool)
        assert pool.stats()["spawned"] == {"paddle": 1, "megatron": 1}  # megatron: the float64 reference's worker
    assert run.dumps["island"].meta["xfalign"] == harness.__version__
    assert run.comparison.status == "pass"


@pytest.mark.xdist_group("in_process_frameworks")  # imports megatron-core here
def test_builtin_provenance_names_installed_file_and_version():
    from importlib.metadata import version

    from harness.ops import framework_impls

    swiglu = {"activation": "swiglu", "bias": False, "weighted": True, "clamp": None, "linear_offset": 0.0}
    paddle = framework_impls("swiglu", "paddle")["fp32_island"].provenance_for(swiglu)
    assert f"xfalign {harness.__version__}, {HARNESS_DIR / 'ops' / 'swiglu' / 'paddle.py'}" in paddle
    mcore = version("megatron-core")
    import megatron.core

    megatron_dir = Path(megatron.core.__file__).resolve().parent
    provenance = framework_impls("swiglu", "megatron")["megatron"].provenance_for(swiglu)
    assert f"megatron-core {mcore}, {megatron_dir / 'fusions' / 'fused_bias_swiglu.py'}" in provenance
    from harness.ops.linear import LinearOptions

    linear = framework_impls("linear", "megatron")["megatron"].provenance_for(LinearOptions().model_dump())
    assert f"megatron-core {mcore}, {megatron_dir / 'tensor_parallel' / 'layers.py'}" in linear
    moe = framework_impls("moe_combine", "megatron")["megatron"].provenance_for(
        {"deterministic": False, "routing": "map"})
    assert f"megatron-core {mcore}, {megatron_dir / 'transformer' / 'moe' / 'moe_utils.py'}" in moe


# 7. Paths and names print literally


def test_paths_and_names_print_literally(tmp_path):
    from harness.cli import _write_outputs

    a, b = known_diff_dumps(rows=16, cols=16)
    a.tensors["w[bold]"] = b.tensors["w[bold]"] = np.ones(2, np.float32)
    comparison = compare_dumps(a, b)
    comparison.case_name = "linear[rows=7]"
    out = console()
    args = argparse.Namespace(json=tmp_path / "r[rows=7].json", html=tmp_path / "linear[rows=7].html")
    _write_outputs(args, [comparison], out)
    print_comparison(comparison, out)
    text = out.file.getvalue()
    assert f"HTML report: {tmp_path / 'linear[rows=7].html'}" in text
    assert f"JSON: {tmp_path / 'r[rows=7].json'}" in text
    assert "w[bold]" in text and "linear[rows=7]" in text


# 8. A single side run with --repeat names its nondeterministic tensors


def test_nondeterminism_helper_names_tensors_of_a_single_side():
    from harness.reports.terminal import print_nondeterministic

    dump = Dump({"side": "paddle", "repeats": {"out": ["a", "b", "a"], "grad.x": ["c", "c", "c"], "w[0]": ["d", "e", "f"]}})
    out = console()
    print_nondeterministic(dump.side, dump.nondeterministic, out)
    lines = out.file.getvalue().splitlines()
    assert lines == ["  ! out is nondeterministic on side paddle: 2 different digests over the repeats",
                     "  ! w[0] is nondeterministic on side paddle: 3 different digests over the repeats"]


NONDETERMINISTIC_PADDLE = """\
import os

import paddle.nn.functional as F


def swiglu(x, bias, probs, options):
    gate, linear = x.cast("float32").chunk(2, axis=-1)
    noise = 1.0 + int.from_bytes(os.urandom(2), "little")  # differs on every call
    return (F.silu(gate) * linear + noise).cast(x.dtype)
"""


def test_single_side_run_with_repeat_reports_nondeterminism(tmp_path, write_case, capsys):
    from harness.cli import main

    (tmp_path / "noisy.py").write_text(NONDETERMINISTIC_PADDLE)
    path = write_case(TINY_PADDLE_PAIR.replace("impl: per_op_rounding", "impl: 'noisy.py:swiglu'"))
    dump = tmp_path / "dumps" / "case[rows=4]"
    assert main(["run", str(path), "--side", "per_op", "--dump", str(dump), "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert f"dumped 2 tensors to {dump}" in out
    assert "  ! out is nondeterministic on side per_op: " in out
