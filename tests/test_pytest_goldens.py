"""The pytest plugin's goldens, as pytest-regressions does it: a missing golden is written and fails once;
`--xfalign-update` rewrites a golden that does not match and fails once; then the item passes."""

from pathlib import Path

import yaml

from conftest import REPORT_ONLY


def golden_file(root: Path) -> Path:
    (found,) = root.glob("*/passing.golden.yaml")
    return found


def test_missing_golden_is_written_and_fails_once_then_update_repairs_drift(pytester):
    pytester.makefile(".yaml", passing=REPORT_ONLY)
    args = ("-p", "no:cacheprovider", "--xfalign-baseline", "goldens")

    first = pytester.runpytest_inprocess(*args)
    first.assert_outcomes(failed=1)
    assert "golden passing: created in" in first.stdout.str()
    written = golden_file(pytester.path / "goldens")
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)

    # The paddle side changes its implementation: its tensors drift from the golden; --xfalign-update rewrites it.
    before = yaml.safe_load(written.read_text())["sides"]["paddle"]["tensors"]["out"]
    pytester.makefile(".yaml", passing=REPORT_ONLY.replace("impl: fp32_island", "impl: per_op_rounding"))
    drifted = pytester.runpytest_inprocess(*args)
    drifted.assert_outcomes(failed=1)
    assert "paddle/out" in drifted.stdout.str()

    updated = pytester.runpytest_inprocess(*args, "--xfalign-update")
    updated.assert_outcomes(failed=1)
    assert "golden passing: updated: paddle/out" in updated.stdout.str()
    assert yaml.safe_load(golden_file(pytester.path / "goldens").read_text())["sides"]["paddle"]["tensors"]["out"] != before
    pytester.runpytest_inprocess(*args, "--xfalign-update").assert_outcomes(passed=1)  # unchanged: nothing rewritten


def test_update_without_baseline_is_a_usage_error(pytester):
    pytester.makefile(".yaml", passing=REPORT_ONLY)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--xfalign-update")
    assert result.ret == 4  # pytest's usage error
    assert "--xfalign-update needs --xfalign-baseline DIR" in result.stderr.str()
