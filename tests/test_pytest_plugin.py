"""`pytest cases/` collects YAML cases as test items (the plugin is registered by entry point).

The inner pytest runs in this process (a real pytest session that loads the plugin by its entry point), so
its cases run on the session's shared workers (the one that needs a machine without a GPU: on workers of its own);
test_bad_inputs keeps one run in a fresh process."""

from conftest import CASE, REPORT_ONLY


def test_cases_are_items_with_table_in_failure_and_junit(pytester):
    pytester.makefile(".yaml", passing=REPORT_ONLY, failing=CASE, unrelated="just: a yaml file\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "grad.probs: expected bitwise, but" in text  # the verdict line
    assert "md5 A" in text and "max ULP" in text  # the per-tensor table
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="passing"' in junit and 'name="failing"' in junit


def test_golden_check_included(pytester):
    """As in pytest-regressions: a missing golden is written and its item fails once; the next run checks it."""
    pytester.makefile(".yaml", passing=REPORT_ONLY)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--xfalign-baseline", "goldens")
    result.assert_outcomes(failed=1)
    assert "golden passing: created in goldens/cpu-avx2; this test fails once" in result.stdout.str()
    assert (pytester.path / "goldens" / "cpu-avx2" / "passing.golden.yaml").is_file()
    again = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--xfalign-baseline", "goldens")
    again.assert_outcomes(passed=1)


def test_bad_case_is_one_failed_item_with_file_line_field_and_the_others_run(pytester):
    pytester.makefile(".yaml", bad=REPORT_ONLY.replace("impl: fp32_island", "impl: nope"), good=REPORT_ONLY)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    assert "bad.yaml:10: sides.paddle.impl: unknown paddle implementation 'nope'" in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


# Both sides torch on cuda (no Paddle needed; one worker, where the GPU is hidden: both sides are N/A).
CUDA_CASE = REPORT_ONLY.replace("  megatron: {framework: megatron, mode: compile}\n  paddle: {framework: paddle, impl: fp32_island}\n",
                                "  compiled: {framework: megatron, mode: compile, device: cuda}\n"
                                "  eager: {framework: megatron, mode: eager, device: cuda}\n")


def test_cuda_case_is_skipped_without_gpu(pytester, hidden_gpu):
    """On a machine without a GPU (the GPU hidden where there is one) a case with a side on cuda is skipped with
    the side's N/A: the framework adapter decides whether the device can be used (FrameworkAdapter.unavailable)."""
    assert "device: cuda" in CUDA_CASE
    pytester.makefile(".yaml", gpu=CUDA_CASE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    assert "case asks for cuda but torch sees no GPU" in result.stdout.str()
