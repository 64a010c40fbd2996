"""Bad cases are refused at load time with one line naming file, line and field."""

import pytest

from harness.case import CaseError
from harness.cli import main
from harness.load import load_case, load_cases

from conftest import SMALL_WEIGHTED


def error_of(path) -> str:
    with pytest.raises(CaseError) as info:
        load_case(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_valid_case_loads(write_case):
    case = load_case(write_case(SMALL_WEIGHTED))
    assert case.name == "case" and list(case.sides) == ["megatron", "paddle"]
    assert case.sides["megatron"].impl is None and case.sides["megatron"].mode == "compile"


@pytest.mark.parametrize("old, new, line, field, words", [
    ("impl: fp32_island", "impl: fp32_islands", 10, "sides.paddle.impl", "unknown paddle implementation"),
    ("dtype: float32", "dtype: float31", 6, "inputs.probs.dtype", "float31"),
    ("mode: compile", "mode: jit", 9, "sides.megatron.mode", "'compile' or 'eager'"),
    ("shape: [16, 1]", "shape: [16]", 6, "inputs.probs.shape", "must have shape [16, 1]"),
    ("shape: [16, 32]", "shape: [16, 33]", 7, "inputs.grad_out.shape", "[16, 32]"),
    ("{weighted: true}", "{weighted: true, bias: true}", 2, "options.bias", "take no bias"),
    ("{weighted: true}", "{weighted: true, clamp: 0}", 2, "options.clamp", "> 0"),
    ("{weighted: true}", "{weighted: true, topk: 2}", 2, "options.topk", "Extra inputs"),
    ("all: bitwise", "all: {max_ulp: -1}", 12, "expect.all.max_ulp", "greater than or equal to 0"),
    ("all: bitwise", "tensors: {grad.bias: bitwise}", 12, "expect.tensors.grad.bias", "no tensor 'grad.bias'"),
    ("op: swiglu", "op: swish", 1, "op", "unknown op family"),
    ("seed: 3", "seed: three", 3, "seed", "integer"),
    ("impl: fp32_island", "impl: 'not a module:x y'", 10, "sides.paddle.impl", "module:function"),
])
def test_bad_field_names_file_line_and_field(write_case, old, new, line, field, words):
    path = write_case(SMALL_WEIGHTED.replace(old, new))
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: {field}: "), message
    assert words in message


def test_missing_input_and_unused_input(write_case):
    missing = write_case(SMALL_WEIGHTED.replace("  probs: {shape: [16, 1], dtype: float32, dist: uniform}\n", ""))
    assert "inputs: missing input 'probs'" in error_of(missing)
    unused = write_case(SMALL_WEIGHTED.replace("{weighted: true}", "{}"))
    assert f"{unused}:6: inputs.probs: input 'probs' is not used" in error_of(unused)


def test_yaml_syntax_error_and_missing_file(write_case, tmp_path):
    broken = write_case(SMALL_WEIGHTED.replace("seed: 3", "seed: [3"))
    assert error_of(broken).startswith(f"{broken}:")
    assert "cannot read case file" in error_of(tmp_path / "nope.yaml")


def test_cli_exits_2_with_one_line(write_case, capsys):
    path = write_case(SMALL_WEIGHTED.replace("impl: fp32_island", "impl: nope"))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"xfalign: error: {path}:10: sides.paddle.impl:") and "\n" not in err


def test_every_builtin_case_is_valid():
    from conftest import ROOT
    paths = sorted((ROOT / "cases").glob("*.yaml")) + sorted((ROOT / "cases" / "gpu").glob("*.yaml"))
    assert len(paths) >= 31
    points = [case for path in paths for case in load_cases(path)]
    assert len(points) == len({case.name for case in points}) >= 50  # sweep points have unique ids
