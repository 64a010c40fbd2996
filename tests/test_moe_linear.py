"""MoE combine and column-parallel linear against real megatron-core; sweeps; load-time rejections."""

import json

import pytest

from harness.case import CaseError
from harness.cli import main
from harness.compare.expectations import Bitwise, MaxUlp, Report
from harness.load import load_cases

MOE = """\
op: moe_combine
vars: {tokens: 24, experts: 6, hidden: 64}
options: {topk: 3, apply_probs: true, empty_experts: 1}
seed: 5
inputs:
  routing_map: {shape: [tokens, experts], dtype: bool}
  expert_out: {shape: [tokens * topk, hidden], dtype: bfloat16}
  probs: {shape: [tokens, experts], dtype: float32, dist: uniform}
  grad_out: {shape: [tokens, hidden], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: fp32_accumulate}
expect:
  all: report
"""

LINEAR = """\
op: linear
vars: {rows: 7, in_features: 64, out_features: 48}
options: {bias: true}
seed: 6
inputs:
  x: {shape: [rows, in_features], dtype: bfloat16}
  weight: {shape: [out_features, in_features], dtype: bfloat16, std: 0.05}
  bias: {shape: [out_features], dtype: bfloat16}
  grad_out: {shape: [rows, out_features], dtype: bfloat16}
sides:
  megatron: {framework: megatron}
  paddle: {framework: paddle, impl: matmul_add}
expect:
  all: report
"""


def run(path, tmp_path, *extra):
    out = tmp_path / "r.json"
    code = main(["run", str(path), "--json", str(out), "--html", str(tmp_path / "html"), *extra])
    return code, json.loads(out.read_text())["cases"] if out.exists() else [None]


def by_name(result):
    return {t["name"]: t for t in result["tensors"]}


def test_moe_combine_sweep_deterministic_and_empty_expert(write_case, tmp_path, capsys):
    path = write_case(MOE + "sweep:\n  deterministic: [false, true]\n")
    code, results = run(path, tmp_path)
    assert code == 0
    assert [r["case"] for r in results] == ["case[deterministic=False]", "case[deterministic=True]"]
    assert "unpermute (scatter_add_)" in results[0]["sides"]["a"]["provenance"]
    assert "unpermute (index_add_ (deterministic))" in results[1]["sides"]["a"]["provenance"]
    for result in results:
        tensors = by_name(result)
        assert list(tensors) == ["out", "grad.expert_out", "grad.probs"]
        assert tensors["grad.probs"]["a"]["shape"] == [24, 6] and tensors["grad.probs"]["a"]["dtype"] == "float32"
        # fp32 probs: Megatron promotes to fp32 and rounds once, like Paddle's fp32 accumulation
        assert tensors["out"]["bitwise"] and tensors["grad.expert_out"]["bitwise"]
    assert "sweep case: 2 points, 2 pass" in capsys.readouterr().out


def test_moe_router_routes_on_both_sides(write_case, tmp_path):
    text = (MOE.replace("empty_experts: 1", "routing: router")
            .replace("  routing_map: {shape: [tokens, experts], dtype: bool}\n", "")
            .replace("  probs: {shape: [tokens, experts], dtype: float32, dist: uniform}\n",
                     "  logits: {shape: [tokens, experts], dtype: float32, std: 2.0}\n"))
    code, (result,) = run(write_case(text), tmp_path)
    assert code == 0
    tensors = by_name(result)
    assert list(tensors) == ["out", "routing.probs", "routing.map", "grad.expert_out", "grad.logits"]
    assert tensors["routing.map"]["bitwise"] and tensors["routing.map"]["a"]["dtype"] == "bool"
    assert "topk_routing_with_score_function" in result["sides"]["a"]["provenance"]


def test_linear_layout_adapter_and_small_m(write_case, tmp_path):
    code, (result,) = run(write_case(LINEAR), tmp_path)
    assert code == 0
    tensors = by_name(result)
    assert list(tensors) == ["out", "grad.x", "grad.weight", "grad.bias"]
    # Paddle got W as [in, out]; its dW comes back in torch's [out, in] layout, same bits expected
    assert tensors["grad.weight"]["a"]["shape"] == tensors["grad.weight"]["b"]["shape"] == [48, 64]
    assert tensors["grad.weight"]["note"].startswith("compared in torch's [out, in] layout")
    assert result["inputs"]["weight"]["shape"] == [48, 64]  # both sides consumed the same weight bits
    assert "ColumnParallelLinear" in result["sides"]["a"]["provenance"]
    assert all(t["a"]["dtype"] == "bfloat16" for t in tensors.values())


def test_not_available_is_a_result_not_a_crash(write_case, tmp_path, capsys):
    path = write_case(LINEAR.replace("impl: matmul_add", "impl: fused_linear")
                      + "sweep:\n  gradient_accumulation_fusion: [false, true]\n")
    code, _ = run(path, tmp_path)
    assert code == 0
    out = capsys.readouterr().out
    assert "N/A case[gradient_accumulation_fusion=False]: not available here: side 'paddle': " \
           "paddle.incubate.nn.functional.fused_linear is not available on cpu" in out
    assert "side 'megatron': gradient_accumulation_fusion needs apex" in out
    assert "sweep case: 2 points, 0 pass, 2 N/A" in out  # N/A is not counted as a pass


@pytest.mark.parametrize("text, old, new, message", [
    (MOE, "topk: 3", "topk: 6", "options.topk: topk 6 is more than the 5 experts that can receive tokens"),
    (MOE, "topk: 3", "topk: 0", "options.topk: Input should be greater than or equal to 1"),
    (MOE, "apply_probs: true", "apply_probs: true, bias: true", "options.bias: Extra inputs are not permitted"),
    (MOE, "shape: [tokens, hidden]", "shape: [tokens, 32]", "inputs.expert_out.shape: expert_out must have shape [72, 32], got [72, 64]"),
    (MOE, "[tokens * topk, hidden]", "[tokens * top_k, hidden]", "inputs.expert_out.shape.0: cannot evaluate 'top_k'"),
    (LINEAR, "shape: [out_features, in_features]", "shape: [out_features, 32]", "inputs.weight.shape: weight is [out, in]"),
    (LINEAR, "options: {bias: true}", "options: {bias: true, topk: 2}", "options.topk: Extra inputs are not permitted"),
    (LINEAR, "expect:", "sweep:\n  inputs.nope.dtype: [float32]\nexpect:", "sweep.inputs.nope.dtype: no field 'nope'"),
])
def test_bad_options_rejected_at_load(write_case, text, old, new, message):
    path = write_case(text.replace(old, new))
    with pytest.raises(CaseError) as info:
        load_cases(path)
    assert str(info.value).startswith(f"{path}:") and message in str(info.value), str(info.value)


def test_sweep_point_error_names_the_point(write_case):
    path = write_case(MOE + "sweep:\n  topk: [2, 9]\n")
    with pytest.raises(CaseError) as info:
        load_cases(path)
    assert "options.topk: topk 9 is more than" in str(info.value) and "(in sweep point case[topk=9])" in str(info.value)


def test_per_point_expectations(write_case):
    points_yaml = ("sweep:\n  rows: [7, 64]\nexpect:\n  all: bitwise\n  tensors: {grad.bias: report}\n"
                   "  points:\n    rows=64: {tensors: {out: {max_ulp: 2}}}\n")
    cases = load_cases(write_case(LINEAR.replace("expect:\n  all: report\n", points_yaml)))
    assert [c.expect.for_tensor("out") for c in cases] == [Bitwise(), MaxUlp(max_ulp=2)]
    assert [c.expect.for_tensor("grad.bias") for c in cases] == [Report(), Report()]
    text = LINEAR.replace("expect:\n  all: report\n", points_yaml.replace("rows=64:", "rows=65:"))
    bad = write_case(text, "bad.yaml")
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "rows=65:" in row)
    with pytest.raises(CaseError) as info:
        load_cases(bad)
    assert str(info.value) == f"{bad}:{line}: expect.points.rows=65: no sweep point 'rows=65' in this sweep"


def test_golden_inputs_come_from_every_side_even_when_the_first_is_not_available(write_case):
    """The Paddle side (first here) cannot run fused_linear on CPU: the golden still records the inputs
    the Megatron side consumed, so the gate's input check stays on."""
    from harness.load import load_case
    from harness.runner import run_case
    from harness.store.golden import Golden

    text = LINEAR.replace("  megatron: {framework: megatron}\n  paddle: {framework: paddle, impl: matmul_add}",
                          "  paddle: {framework: paddle, impl: fused_linear}\n  megatron: {framework: megatron}")
    run = run_case(load_case(write_case(text)))
    assert run.comparison.status == "n/a"
    assert set(Golden.from_run(run).inputs) == {"x", "weight", "bias", "grad_out"}
