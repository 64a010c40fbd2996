"""The pytest plugin's goldens, under the gate's golden policy (harness.golden_policy): a missing golden is written
and fails once (as pytest-regressions); `--xfalign-golden check` writes none; a drift leaves `.obtained` beside the
golden; `--xfalign-update` (force-regen) rewrites a golden that does not match and passes."""

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
    obtained = written.with_name("passing.golden.obtained.yaml")  # not collected as a case
    assert yaml.safe_load(obtained.read_text())["sides"]["paddle"]["tensors"]["out"] != before

    updated = pytester.runpytest_inprocess(*args, "--xfalign-update")  # force-regen: rewritten, then it passes
    updated.assert_outcomes(passed=1)
    assert "golden passing: updated: paddle/out" in updated.stdout.str() or not obtained.exists()
    assert yaml.safe_load(golden_file(pytester.path / "goldens").read_text())["sides"]["paddle"]["tensors"]["out"] != before
    assert not obtained.exists()
    pytester.runpytest_inprocess(*args, "--xfalign-update").assert_outcomes(passed=1)  # unchanged: nothing rewritten


def test_check_writes_no_missing_golden_regen_all_passes_and_unused_are_listed(pytester):
    pytester.makefile(".yaml", passing=REPORT_ONLY)
    args = ("-p", "no:cacheprovider", "--xfalign-baseline", "goldens")
    checked = pytester.runpytest_inprocess(*args, "--xfalign-golden", "check")
    checked.assert_outcomes(failed=1)
    assert "no golden yet, and the check policy writes none" in checked.stdout.str()
    assert not (pytester.path / "goldens").exists()
    pytester.runpytest_inprocess(*args, "--xfalign-golden", "regen-all").assert_outcomes(passed=1)
    stale = golden_file(pytester.path / "goldens").with_name("gone.golden.yaml")
    stale.write_text("# a golden of a case no longer run\n")
    listed = pytester.runpytest_inprocess(*args, "--xfalign-warn-unused")
    listed.assert_outcomes(passed=1)
    assert "unused golden: goldens/cpu-avx2/gone.golden.yaml: no case of this run produces it" in listed.stdout.str()


def test_update_without_baseline_is_a_usage_error(pytester):
    pytester.makefile(".yaml", passing=REPORT_ONLY)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--xfalign-update")
    assert result.ret == 4  # pytest's usage error
    assert "--xfalign-update needs --xfalign-baseline DIR" in result.stderr.str()
