"""Fingerprints name what decides the bits; profiles pin it; goldens are kept per environment class."""

import json

import pytest

from harness.case import CaseError
from harness.cli import main
from harness.fingerprint import changed_fields
from harness.gate import check
from harness.load import load_case
from harness.reports.text import environment_change_text
from harness.runner import run_case
from harness.store.golden import Golden

from conftest import SMALL_WEIGHTED

SMALL_REPORT = SMALL_WEIGHTED.replace("all: bitwise", "all: report")

TINY_MOE = """\
op: moe_combine
vars: {tokens: 8, experts: 4, hidden: 16}
options: {topk: 2, deterministic: true}
inputs:
  routing_map: {shape: [tokens, experts], dtype: bool}
  probs: {shape: [tokens, experts], dtype: float32, dist: uniform}
  expert_out: {shape: [tokens * topk, hidden], dtype: bfloat16}
  grad_out: {shape: [tokens, hidden], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: fp32_accumulate}
"""


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp") / "small.yaml"
    path.write_text(SMALL_REPORT)
    return run_case(load_case(path))


def test_every_dump_records_what_decides_its_bits(small_run):
    torch_side = small_run.dumps["megatron"].meta["environment"]
    paddle_side = small_run.dumps["paddle"].meta["environment"]
    for fields in (torch_side, paddle_side):
        for name in ("cpu_model", "cpu_isa", "numpy", "ml_dtypes", "safetensors", "xfalign", "numerics_profile",
                     "environment_class", "env.MKL_CBWR", "env.OMP_NUM_THREADS"):
            assert fields.get(name) is not None, name
        assert "version_line" not in fields
    for name in ("torch_cpu_capability", "torch_mkldnn_enabled", "onednn", "mkl", "torch_threads", "inductor_simdlen"):
        assert name in torch_side, name
    assert torch_side["torch_mkldnn_enabled"] is False and torch_side["torch_threads"] == 1  # the default profile's pins
    assert torch_side["torch_cpu_capability"] == "AVX2" and torch_side["inductor_simdlen"] == 256
    for name in ("paddle_with_mkl", "paddle_cpu_avx512f", "paddle_threads"):
        assert name in paddle_side, name
    assert small_run.environment_class == "cpu-avx2" == torch_side["environment_class"]


def test_drift_message_names_each_changed_field(small_run):
    golden = Golden.from_run(small_run)
    golden.environment["megatron"]["torch_cpu_capability"] = "AVX512"
    golden.tensors["megatron"]["out"] = golden.tensors["megatron"]["grad.x"]  # a drifted digest
    result = check(small_run, golden)
    assert [environment_change_text(f) for f in result.environment_changes] == ["megatron: torch cpu capability AVX512 → AVX2"]


def test_code_changed_only_when_every_field_is_equal(small_run):
    golden = Golden.from_run(small_run)
    golden.tensors["paddle"]["out"] = golden.tensors["paddle"]["grad.x"]
    assert check(small_run, golden).environment_changes == []  # all equal: the code changed
    for side in golden.environment:  # a golden written before fingerprints stopped recording version_line
        golden.environment[side]["version_line"] = "paddle 3.3.1"
    assert check(small_run, golden).environment_changes == []
    del golden.environment["paddle"]["paddle_cpu_avx512f"]  # an older golden that did not record it
    recorded = small_run.dumps["paddle"].meta["environment"]["paddle_cpu_avx512f"]  # this CPU's: True where it has AVX-512
    assert isinstance(recorded, bool)
    changes = check(small_run, golden).environment_changes
    assert [environment_change_text(f) for f in changes] == [f"paddle: paddle cpu avx512f not recorded → {recorded}"]


def test_changed_fields_cover_fields_on_either_side():
    assert changed_fields({"a": 1, "gone": 2, "none": None}, {"a": 1, "new": 3}) == ["new", "gone", "none"]
    assert changed_fields({"a": 1, "version_line": "torch 2.9"}, {"a": 1}) == []  # no longer recorded


def test_deterministic_setting_is_recorded_as_it_was_while_the_op_ran(write_case):
    run = run_case(load_case(write_case(TINY_MOE)))
    assert run.dumps["megatron"].meta["environment"]["deterministic_algorithms"] is True
    assert "index_add_" in run.dumps["megatron"].meta["provenance"]


UNPINNED = {"megatron": ("torch_mkldnn_enabled", True), "paddle": ("paddle_threads", "default")}


# One side per run: a new profile means new workers (the profile's environment is read at import). Paddle starts in
# about a second; torch takes several (slow set).
@pytest.mark.parametrize("side", [pytest.param("megatron", marks=pytest.mark.slow), "paddle"])
def test_profile_per_run_and_per_case(write_case, tmp_path, side):
    path = write_case(SMALL_REPORT)
    dump = tmp_path / side
    assert main(["run", str(path), "--numerics", "native", "--side", side, "--dump", str(dump)]) == 0
    native = json.loads((dump / "meta.json").read_text())["environment"]
    assert native["numerics_profile"] == "native" and native["environment_class"].startswith("cpu-native-")
    field, value = UNPINNED[side]  # what the default profile pins, left to the library
    assert "env.MKL_CBWR" not in native and native[field] == value
    per_case = load_case(write_case(SMALL_REPORT.replace("seed: 3", "seed: 3\nnumerics: native"), "native.yaml"))
    assert per_case.numerics == "native"


def test_unknown_profile_is_a_one_line_error_with_file_and_line(write_case, tmp_path, capsys):
    path = write_case(SMALL_REPORT.replace("seed: 3", "seed: 3\nnumerics: fastest"))
    with pytest.raises(CaseError, match=r"case.yaml:4: numerics: no numerics profile 'fastest' .*known: native, portable-avx2"):
        load_case(path)
    assert main(["run", str(write_case(SMALL_REPORT, "ok.yaml")), "--numerics", "fastest"]) == 2
    assert "no numerics profile 'fastest'" in capsys.readouterr().err


def test_gate_without_goldens_for_this_class_says_which_class_and_how(write_case, tmp_path, capsys):
    path = write_case(SMALL_REPORT)
    root = tmp_path / "baselines"
    (root / "cpu-native-amx").mkdir(parents=True)
    assert main(["gate", str(path), "--baseline", str(root), "--golden", "check"]) == 2  # as CI runs it
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "environment class is cpu-avx2" in err and "classes there: cpu-native-amx" in err
    assert f"xfalign gate {path} --baseline {root} --update" in err
    assert not (root / "cpu-avx2").exists()  # check writes nothing
    assert main(["gate", str(path), "--baseline", str(root)]) == 1  # the default policy writes them, and fails once
    assert (root / "cpu-avx2").is_dir()
