"""The float64 references of the linear and rmsnorm families, run as a case runs them (harness.runner.run_case: a
worker of the real torch + megatron-core, every float input widened to float64): for every option combination the
reference's output and gradients are float64 and agree with a numpy float64 formula written here from the math, and
the comparison of the two sides is arbitrated by it (comparison.reference set, every float tensor measured)."""

import numpy as np
import pytest

from harness.inputs import generate_inputs
from harness.load import load_cases
from harness.runner import run_case
from harness.store.dump import Dump

TOLERANCE = 1e-12  # normwise relative: float64 work of a few hundred terms is ~1e-15


def normwise(got, want):
    scale = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (scale if scale else 1.0)


def run_points(tmp_path, text):
    """Each sweep point of the case run end to end (both sides and the reference); yields (case, run, inputs as
    float64, the reference's tensors)."""
    path = tmp_path / "case.yaml"
    path.write_text(text)
    for index, case in enumerate(load_cases(path)):
        folder = tmp_path / f"point-{index}"
        dumps = {side: folder / side for side in case.sides} | {"exact": folder / "exact"}
        run = run_case(case, dumps)
        inputs = {name: array.astype(np.float64) for name, array in generate_inputs(case).items()}
        yield case, run, inputs, Dump.read(dumps["exact"]).tensors


def check_reference(run, reference, expected, *provenance):
    assert set(reference) == set(expected)
    for name, want in expected.items():
        got = np.asarray(reference[name])
        assert got.dtype == np.float64 and got.shape == want.shape, name
        assert normwise(got, want) <= TOLERANCE, (name, normwise(got, want))
    comparison = run.comparison
    if comparison.unavailable:  # a side that cannot run here: nothing is compared, nothing arbitrated
        return
    assert comparison.reference is not None and comparison.reference_missing is None
    assert all(words in comparison.reference.provenance for words in provenance), comparison.reference.provenance
    assert {result.name for result in comparison.tensors} == set(expected)
    for result in comparison.tensors:
        exact = result.pair.exact
        assert exact is not None and exact.missing is None, result.name
        assert exact.a is not None and exact.b is not None and exact.closeness is not None, result.name
        assert exact.a.elements == exact.b.elements == expected[result.name].size


# -- linear ---------------------------------------------------------------------------------------------------

LINEAR = """\
op: linear
vars: {{in_features: 37, out_features: 11}}
options: {{bias: {bias}}}
seed: 5
inputs:
  x: {{shape: {x}, dtype: bfloat16, special_values: [0.0, 1024.0, -1024.0], special_fraction: 0.1}}
  weight: {{shape: [out_features, in_features], dtype: bfloat16, std: 0.05}}
{bias_input}  grad_out: {{shape: {g}, dtype: bfloat16}}
sides:
  megatron: {{framework: megatron, impl: megatron}}
  paddle: {{framework: paddle, impl: functional_linear}}
sweep:
  gradient_accumulation_fusion: [false, true]
  dtype: [bfloat16, float32]
expect:
  all: report
"""


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [[6], [3, 2]], ids=["2d", "3d"])
def test_linear_reference_is_megatrons_formula_in_float64(tmp_path, bias, rows):
    text = LINEAR.format(bias=str(bias).lower(), x=rows + ["in_features"], g=rows + ["out_features"],
                         bias_input="  bias: {shape: [out_features], dtype: bfloat16, std: 0.5}\n" if bias else "")
    points = 0
    for case, run, inputs, reference in run_points(tmp_path, text):
        x, weight, g = inputs["x"], inputs["weight"], inputs["grad_out"]
        x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
        expected = {"out": x @ weight.T + (inputs["bias"] if bias else 0.0), "grad.x": g @ weight,
                    "grad.weight": g2.T @ x2}
        if bias:
            expected["grad.bias"] = g2.sum(0)
        check_reference(run, reference, expected, "ColumnParallelLinear", "megatron-core 0.16.1")
        if case.options["gradient_accumulation_fusion"]:  # needs apex: Megatron's side cannot run, the reference can
            assert "megatron" in run.comparison.unavailable
        points += 1
    assert points == 4


# -- rmsnorm --------------------------------------------------------------------------------------------------

RMSNORM = """\
op: rmsnorm
vars: {{hidden: 45}}
seed: 6
inputs:
  x: {{shape: {x}, dtype: bfloat16, special_values: [0.0, 181.0, -181.0], special_fraction: 0.05}}
  weight: {{shape: [hidden], dtype: bfloat16, std: 0.5}}
  grad_out: {{shape: {x}, dtype: bfloat16}}
sides:
  megatron: {{framework: megatron, impl: te_reference}}
  paddle: {{framework: paddle, impl: fp32_island}}
sweep:
  zero_centered_gamma: [false, true]
  eps: [1.0e-5, 0.5]
  dtype: [bfloat16, float16]
expect:
  all: report
"""


def rmsnorm_float64(x, weight, g, eps, zero_centered_gamma):
    """y = x / sqrt(mean(x^2) + eps) * gamma, gamma = weight (+ 1), and its gradients by hand."""
    gamma = weight + 1.0 if zero_centered_gamma else weight
    n = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    x_hat = x * r
    dy = g * gamma
    return {"out": x_hat * gamma, "grad.x": r * (dy - x_hat * np.sum(dy * x_hat, axis=-1, keepdims=True) / n),
            "grad.weight": (g * x_hat).reshape(-1, n).sum(0)}


@pytest.mark.parametrize("rows", [[7], [3, 2]], ids=["2d", "3d"])
def test_rmsnorm_reference_is_the_formula_in_float64(tmp_path, rows):
    points = 0
    for case, run, inputs, reference in run_points(tmp_path, RMSNORM.format(x=rows + ["hidden"])):
        options = case.options
        expected = rmsnorm_float64(inputs["x"], inputs["weight"], inputs["grad_out"], options["eps"],
                                   options["zero_centered_gamma"])
        # zero-centred gamma: only TENorm has it (the TE formula in float64); otherwise megatron-core's CPU norm
        words = ("Transformer Engine", "xfalign") if options["zero_centered_gamma"] else \
            ("WrappedTorchNorm", "megatron-core 0.16.1")
        check_reference(run, reference, expected, *words)
        points += 1
    assert points == 8
