"""The float64 reference end to end: run in the worker of its framework (no process of its own per case),
from the sides' input bits widened exactly, dumped, arbitrating the comparison; its N/A and failure paths."""

import json
import textwrap

import numpy as np
import pytest

from harness.case import REFERENCE_SIDE
from harness.cli import main
from harness.load import load_cases
from harness.run_options import RunOptions
from harness.runner import NO_REFERENCE_RUN, WorkerPool, run_case

CASE = """\
op: swiglu
seed: 5
inputs:
  x: {shape: [24, 2 * 40], dtype: bfloat16, std: 2.0, special_values: [0.0, 8.0, -8.0], special_fraction: 0.1}
  grad_out: {shape: [24, 40], dtype: bfloat16}
sides:
  megatron: {framework: megatron, impl: megatron, mode: eager}
  paddle: {framework: paddle, impl: %s}
expect:
  all: {max_ulp_to_exact: {paddle: 1}}
"""


def _silu_product(x: np.ndarray) -> np.ndarray:
    gate, linear = np.split(x, 2, axis=-1)
    return gate / (1 + np.exp(-gate)) * linear


def test_the_reference_is_megatrons_formula_in_float64_and_arbitrates_each_tensor(write_case, tmp_path):
    [case] = load_cases(write_case(CASE % "fp32_island"))
    dumps = {side: tmp_path / side for side in (*case.sides, REFERENCE_SIDE)}
    run = run_case(case, dumps)
    comparison = run.comparison
    assert comparison.reference is not None and comparison.reference_missing is None
    assert "weighted" not in comparison.reference.provenance and "bias_swiglu_impl" in comparison.reference.provenance
    from harness.store.dump import Dump

    exact, side = Dump.read(dumps[REFERENCE_SIDE]), Dump.read(dumps["megatron"])
    assert exact.side == REFERENCE_SIDE and exact.meta["inputs"] == side.meta["inputs"]  # the inputs as given
    assert {str(exact.tensors[name].dtype) for name in exact.tensors} == {"float64"}
    x = np.load(tmp_path / "x.npy") if (tmp_path / "x.npy").exists() else None
    assert x is None  # inputs are not dumped: rebuild them from the case
    from harness.inputs import generate_inputs

    inputs = generate_inputs(case)
    wide = inputs["x"].astype(np.float64)
    np.testing.assert_allclose(exact.tensors["out"], _silu_product(wide), rtol=1e-14, atol=0)
    for result in comparison.tensors:  # Paddle's fp32 island rounds once: within 1 ULP of exact
        assert result.pair.exact.a is not None and result.pair.exact.b is not None, result.name
        assert result.holds, [f.data for f in result.failures]
    # Megatron eager rounds every op to bf16: farther from exact than the fp32 island, normwise
    grad_x = next(r.pair.exact for r in comparison.tensors if r.name == "grad.x")
    assert grad_x.a.normwise > grad_x.b.normwise and grad_x.closeness.b_closer > grad_x.closeness.a_closer


def test_no_reference_run_says_so_and_a_failing_reference_leaves_the_case_to_its_sides(write_case, tmp_path):
    [case] = load_cases(write_case(CASE % "fp32_island"))
    run = run_case(case, options=RunOptions(reference=False))
    assert run.comparison.reference is None and run.comparison.reference_missing == NO_REFERENCE_RUN
    assert not run.comparison.passed  # max_ulp_to_exact cannot be judged without the reference
    (tmp_path / "family.py").write_text(textwrap.dedent("""
        from harness.ops.swiglu import SwigluFamily

        class NoFloat64(SwigluFamily):
            reference = {"megatron": "broken.py:reference"}
        """))
    (tmp_path / "broken.py").write_text("def reference(x, bias, probs, options):\n    raise RuntimeError('no float64 kernel')\n")
    [case] = load_cases(write_case((CASE % "fp32_island").replace("op: swiglu", "op: family.py:NoFloat64")
                                   .replace("{max_ulp_to_exact: {paddle: 1}}", "report")))
    comparison = run_case(case).comparison
    assert comparison.reference is None and comparison.passed
    assert "the float64 reference failed: RuntimeError: no float64 kernel" in comparison.reference_missing


def test_the_reference_of_a_case_without_a_torch_side_runs_in_one_shared_worker(write_case):
    cases = [load_cases(write_case(CASE.replace("megatron: {framework: megatron, impl: megatron, mode: eager}",
                                                "eager: {framework: paddle, impl: per_op_rounding}") % impl,
                                   f"case{i}.yaml"))[0] for i, impl in enumerate(("fp32_island", "fp32_island"))]
    with WorkerPool(jobs=2) as pool:
        runs = [run_case(case, pool=pool) for case in cases]
        spawned = pool.stats()["spawned"]
    assert all(run.comparison.reference is not None for run in runs)
    assert spawned == {"paddle": 1, "megatron": 1}  # one worker per framework for the whole run


def test_run_seeds_runs_each_case_on_other_seeds(write_case, tmp_path, capsys):
    path = write_case(CASE % "fp32_island")
    code = main(["run", str(path), "--seeds", "2", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path)])
    data = json.loads((tmp_path / "r.json").read_text())
    assert code == 0, capsys.readouterr().out
    assert [c["case"] for c in data["cases"]] == ["case[seed=1005]", "case[seed=2005]"]
    assert len({c["inputs"]["x"]["md5"] for c in data["cases"]}) == 2
    assert all(t["to_exact"]["b"]["max_ulp"] <= 1 for c in data["cases"] for t in c["tensors"])


def test_a_reference_that_kills_its_worker_is_na_and_the_sides_results_stand(write_case, tmp_path):
    """The reference runs after the Megatron side in that side's job: its crash is the reference's (N/A), not
    the side's, and the next case gets a fresh worker and its reference."""
    (tmp_path / "family.py").write_text(textwrap.dedent("""
        from harness.ops.swiglu import SwigluFamily

        class KillsItsWorker(SwigluFamily):
            reference = {"megatron": "crash.py:reference"}
        """))
    (tmp_path / "crash.py").write_text("import os, signal\n\ndef reference(x, bias, probs, options):\n"
                                       "    os.kill(os.getpid(), signal.SIGKILL)\n")
    [crashing] = load_cases(write_case((CASE % "fp32_island").replace("op: swiglu", "op: family.py:KillsItsWorker")
                                       .replace("{max_ulp_to_exact: {paddle: 1}}", "report"), "crash.yaml"))
    [normal] = load_cases(write_case(CASE % "fp32_island", "normal.yaml"))
    with WorkerPool(jobs=2) as pool:
        run = run_case(crashing, pool=pool)
        after = run_case(normal, pool=pool)
        spawned = pool.stats()["spawned"]
    comparison = run.comparison
    assert comparison.reference is None and comparison.passed
    assert [result.name for result in comparison.tensors] == ["out", "grad.x"]
    assert comparison.reference_missing.startswith("the float64 reference crashed: side 'exact' was killed by SIGKILL")
    assert after.comparison.reference is not None and after.comparison.passed
    assert spawned["megatron"] == 2  # the killed worker, then its replacement


@pytest.mark.xdist_group("in_process_frameworks")
def test_a_hold_sets_megatrons_group_up_once_and_tears_it_down_when_it_ends(torch):
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    from harness.frameworks.megatron_group import hold, one_process_group

    with one_process_group("cpu"):
        assert parallel_state.model_parallel_is_initialized()
    assert not dist.is_initialized()  # without a hold: torn down after the block
    with hold():
        with one_process_group("cpu"):
            world = dist.group.WORLD
        assert dist.is_initialized() and parallel_state.model_parallel_is_initialized()
        with one_process_group("cpu"):
            assert dist.group.WORLD is world  # reused, not set up again
    assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()
