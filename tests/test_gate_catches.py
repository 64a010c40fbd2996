"""What the gate and the built-in expectations must catch (issue: expectations that hold for any seed):
a Paddle variant whose output moves by one ULP in one element fails the gate as drift, and a variant made
less accurate fails its bound against the exact result on every seed. Run on a built-in case, unchanged but
for the Paddle side's implementation (tests/data/degraded_variants.py)."""

import json
import re
import shutil
from pathlib import Path

import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "cases" / "swiglu_weighted.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture
def variant_case(tmp_path):
    shutil.copy(Path(__file__).parent / "data" / "degraded_variants.py", tmp_path / "degraded.py")
    text = CASE.read_text()
    assert "paddle: {framework: paddle, impl: fp32_island}" in text

    def make(impl: str | None) -> Path:
        path = tmp_path / CASE.name
        replacement = f"impl: 'degraded.py:{impl}'" if impl else "impl: fp32_island"
        path.write_text(text.replace("impl: fp32_island}", replacement + "}"))
        return path

    return make


def test_one_element_one_ulp_off_fails_the_gate_as_drift(variant_case, tmp_path, capsys):
    baseline = tmp_path / "baseline"
    assert main(["gate", str(variant_case(None)), "--baseline", str(baseline), "--update", "--html", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["gate", str(variant_case("one_ulp_off")), "--baseline", str(baseline), "--html", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"\[drift\] paddle/out: drifted from the golden: 1 of [\d,]+ elements differ, max 1 ULP", out), out
    assert "megatron/" not in out.split("FAIL", 1)[-1].split("\n[", 1)[0]  # nothing blamed on Megatron


def test_a_less_accurate_variant_fails_its_bound_against_exact_on_every_seed(variant_case, tmp_path):
    report = tmp_path / "r.json"
    assert main(["run", str(variant_case("early_rounding")), "--seeds", "3", "--json", str(report),
                 "--html", str(tmp_path)]) == 1
    cases = json.loads(report.read_text())["cases"]
    assert len(cases) == 3
    for case in cases:
        failing = [f for t in case["tensors"] for f in t["findings"] if not f["passed"]]
        assert failing, case["case"]
        assert all(f["kind"] in ("exact-error", "no-worse-than") and f["data"]["side"] == "paddle" for f in failing), \
            [f["text"] for f in failing]
