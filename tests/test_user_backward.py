"""A user forward with its own backward (`impl:` + `backward:`), wrapped as a PyLayer / autograd.Function."""

import shutil

import pytest

from harness.case import CaseError
from harness.load import load_case
from harness.runner import run_case

from conftest import ROOT

CASE = """\
op: swiglu
options: {weighted: true}
seed: 4
inputs:
  x: {shape: [32, 128], dtype: bfloat16, std: 2.0}
  probs: {shape: [32, 1], dtype: float32, dist: uniform}
  grad_out: {shape: [32, 64], dtype: bfloat16}
sides:
  builtin: {framework: paddle, impl: fleet_cpu_fallback}
  user: {framework: paddle, impl: "fleet.py:forward", backward: "fleet.py:BACKWARD"}
expect:
  all: bitwise
"""


@pytest.fixture
def fleet_file(tmp_path):
    shutil.copy(ROOT / "cases" / "user" / "fleet_swiglu_scale.py", tmp_path / "fleet.py")
    return tmp_path / "fleet.py"


def test_hand_written_backward_matches_the_builtin_bitwise(write_case, fleet_file):
    run = run_case(load_case(write_case(CASE.replace("BACKWARD", "backward"))))
    assert run.comparison.status == "pass"
    builtin, user = run.dumps["builtin"].tensors, run.dumps["user"].tensors
    assert list(user) == ["out", "grad.x", "grad.probs"] and user["grad.probs"].shape == (32,)  # PaddleFleet's d_scale
    assert all(user[name].tobytes() == builtin[name].tobytes() for name in builtin)
    assert "backward: user function" in run.dumps["user"].meta["provenance"]


def test_a_wrong_backward_is_detected(write_case, fleet_file):
    text = fleet_file.read_text()
    fleet_file.write_text(text + "\n\ndef wrong(out_grad, x, bias, probs, options):\n"
                                 "    d_x, d_bias, d_probs = backward(out_grad, x, bias, probs, options)\n"
                                 "    return d_x * 1.0078125, d_bias, d_probs\n")
    run = run_case(load_case(write_case(CASE.replace("BACKWARD", "wrong"))))
    builtin, user = run.dumps["builtin"].tensors, run.dumps["user"].tensors
    assert user["out"].tobytes() == builtin["out"].tobytes()  # the forward is the same
    assert user["grad.x"].tobytes() != builtin["grad.x"].tobytes()
    assert run.comparison.status == "fail"


def test_backward_needs_a_user_forward_and_must_exist(write_case, fleet_file):
    builtin = write_case(CASE.replace('impl: fleet_cpu_fallback}', 'impl: fleet_cpu_fallback, backward: "fleet.py:backward"}'))
    with pytest.raises(CaseError, match=r":9: sides.builtin.backward: .*a backward goes with a user forward"):
        load_case(builtin)
    missing = write_case(CASE.replace("BACKWARD", "nope"))
    with pytest.raises(CaseError, match=r":10: sides.user.backward: fleet.py defines no 'nope'"):
        load_case(missing)
