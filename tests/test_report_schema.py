"""The JSON report's published JSON Schema (harness/reports/report.schema.json, package data): it is what the
models of harness.reports.json_schema make, and real reports (an op case run, a gate, two capture trees, a tree
gate) validate against the shipped file with the jsonschema library, as a reader of the reports would."""

import json
import math
import tomllib
from fnmatch import fnmatch

import jsonschema
import numpy as np
import pytest
from test_capture_compare import one_ulp_in_weight, write_tree
from test_install import CASE as EAGER_CASE

from harness.cli import main
from harness.compare.case import compare_dumps
from harness.compare.findings import (
    PAYLOADS,
    DigestDiffers,
    DtypeDiffers,
    EnvironmentChanged,
    ExactErrorOverBound,
    ExactValues,
    Finding,
    FloatValues,
    InputChanged,
    Missing,
    NeedsValues,
    NoGolden,
    Nondeterministic,
    NoReference,
    NotApplicable,
    OtherGenerator,
    ReplicasDiffer,
    ShapeDiffers,
    WorseThan,
)
from harness.reports.json_report import write_json
from harness.reports.json_schema import SCHEMA_PATH, schema_text

from conftest import ROOT
from report_fixtures import dumps_of, known_diff_dumps

CASE = EAGER_CASE.replace("all: report", "all: [bitwise, {max_ulp_to_exact: 0}]")  # failing findings, measured


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors_of(validator, path) -> list[str]:
    return [f"{error.json_path}: {error.message[:300]}" for error in validator.iter_errors(json.loads(path.read_text()))]


def test_the_shipped_schema_is_what_the_models_make():
    assert SCHEMA_PATH.read_text() == schema_text(), "run: python -m harness.reports.json_schema"


def test_the_package_ships_the_schema():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    name = SCHEMA_PATH.relative_to(ROOT / "harness" / "reports").as_posix()
    assert any(fnmatch(name, pattern) for pattern in package_data["harness.reports"])


def test_an_op_case_run_and_its_gate_validate(write_case, tmp_path, validator):
    pytest.importorskip("paddle", reason="the case's Paddle side")
    case = write_case(CASE)
    assert main(["run", str(case), "--json", str(tmp_path / "run.json"), "--html", str(tmp_path / "run")]) in (0, 1)
    report = json.loads((tmp_path / "run.json").read_text())
    (tensor, *_) = report["cases"][0]["tensors"]
    assert tensor["to_exact"]["a"] is not None  # the float64 reference's part of the schema is checked too
    assert errors_of(validator, tmp_path / "run.json") == []
    gate = ["gate", str(case), "--baseline", str(tmp_path / "goldens"), "--json", str(tmp_path / "gate.json"),
            "--html", str(tmp_path / "gate")]
    assert main(gate) == 1  # the golden written now: fails once
    assert errors_of(validator, tmp_path / "gate.json") == []


def test_capture_tree_comparisons_and_a_tree_gate_validate(tmp_path, validator):
    a = write_tree(tmp_path / "a", "megatron", mode="digest")
    b = write_tree(tmp_path / "b", "paddle", steps=3, change=one_ulp_in_weight)
    assert main(["compare", str(a), str(b), "--json", str(tmp_path / "trees.json"), "--html", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "trees.json").read_text())
    assert report["tree"]["findings"] and report["tree"]["first_divergent"] is not None
    assert errors_of(validator, tmp_path / "trees.json") == []
    drifted = write_tree(tmp_path / "drifted", "megatron", mode="digest", change=one_ulp_in_weight)
    gate = ["gate", "--tree", str(a), "--baseline", str(tmp_path / "goldens"), "--html", str(tmp_path)]
    assert main([*gate, "--json", str(tmp_path / "written.json")]) == 1
    gate[2] = str(drifted)
    assert main([*gate, "--json", str(tmp_path / "drifted.json")]) == 1
    for name in ("written.json", "drifted.json"):
        assert errors_of(validator, tmp_path / name) == [], name


SAMPLES = {  # one payload of each kind, as its producer makes it
    Missing: Missing(side="B", reason="the map made none"),
    DtypeDiffers: DtypeDiffers(a="float32", b="bfloat16"),
    ShapeDiffers: ShapeDiffers(a=[8], b=[8, 1], flattened=True),
    FloatValues: FloatValues(elements=4, differing=2, measured=True, max_ulp=3, max_ulp_flat_index=1, max_abs=math.inf,
                             nan_mismatch=1, inf_mismatch=0, signed_zero_only=0, signed_zero_first_index=None,
                             nan_payload_only=0, nan_payload_first_index=None),
    ExactValues: ExactValues(elements=4, differing=1, dtype="int32"),
    DigestDiffers: DigestDiffers(a="00ff", b="ff00", values=False, digests_only=["A"],
                                 stats={"a": {"norm": math.nan, "nan": 1}, "b": None}).model_copy(update={"hash": "fast64"}),
    NotApplicable: NotApplicable(expectation="max_ulp 1", dtype="bool"),
    NeedsValues: NeedsValues(expectation="max_ulp 1", sides=["B"]),
    ExactErrorOverBound: ExactErrorOverBound(side="paddle", metric="normwise_u", measured=math.inf, bound=2.0,
                                             class_mismatch=1),
    WorseThan: WorseThan(side="paddle", than="megatron", factor=1.0, normwise_u=3.0, than_normwise_u=1.0,
                         class_mismatch=0, than_class_mismatch=0),
    NoReference: NoReference(expectation="max_ulp_to_exact 0", side=None, reason="not-given"),
    InputChanged: InputChanged(golden={"dtype": "float32", "shape": [4], "md5": "0" * 32}, now=None),
    OtherGenerator: OtherGenerator(golden=1, now=2),
    Nondeterministic: Nondeterministic(side="paddle", distinct=2, repeats=3),
    ReplicasDiffer: ReplicasDiffer(side="megatron", ranks=[1, 3], world=4),
    NoGolden: NoGolden(written="goldens/x.golden.yaml"),
    EnvironmentChanged: EnvironmentChanged(field="torch", golden=None, now="2.13.0"),
}


def test_every_finding_kind_and_non_finite_floats_validate(tmp_path, validator):
    assert set(SAMPLES) == set(PAYLOADS.values()), "a new finding kind needs a sample here"
    a, b = known_diff_dumps(rows=16, cols=8)
    comparison = compare_dumps(a, b)
    comparison.tensors[0].findings = [Finding("out", False, payload, "bitwise") for payload in SAMPLES.values()]
    write_json([comparison], tmp_path / "all.json")
    assert '"max_abs": "inf"' in (tmp_path / "all.json").read_text()
    assert errors_of(validator, tmp_path / "all.json") == []


def test_the_schema_is_a_real_check(tmp_path, validator):
    a, b = dumps_of({"out": np.zeros(4, np.float32)}, {"out": np.ones(4, np.float32)})
    write_json([compare_dumps(a, b)], tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert not list(validator.iter_errors(report))
    finding = report["cases"][0]["tensors"][0]["findings"][0]
    for broken in ({**finding, "kind": "dtype"},  # the data of another kind
                   {**finding, "data": {**finding["data"], "max_ulp": "many"}},
                   {**finding, "extra": 1}):
        report["cases"][0]["tensors"][0]["findings"] = [broken]
        assert list(validator.iter_errors(report)), broken
