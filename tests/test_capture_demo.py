"""The MLP demo (examples/mlp_alignment): a real megatron-core MLP and the Paddle MLP, identical weights
through map.yaml, both captured, compared, replayed. Fast tests run Megatron's bias SwiGLU eagerly (no
torch.compile); the compiled one, which the fused_bias_swiglu variant matches bit for bit, is @slow."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "mlp_alignment"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A's capture (Megatron, eager SwiGLU) and B's (Paddle, fused_bias_swiglu), made once."""
    sys.path.insert(0, str(DEMO))
    import run_demo

    from harness.capture.mapping import load_map

    out = tmp_path_factory.mktemp("demo")
    tensor_map = load_map(DEMO / "map.yaml")
    tree_a = run_demo.capture_megatron(out / "megatron", eager=True)
    model_b = run_demo.capture_paddle(out / "paddle", tree_a, "fused_bias_swiglu", tensor_map)
    return run_demo, tensor_map, tree_a, out / "paddle", model_b


def test_weights_loaded_through_the_map_are_identical(demo):
    run_demo, tensor_map, tree_a, tree_b, model_b = demo
    import paddle_mlp

    from harness.store.tree import read_tree

    loaded = paddle_mlp.parameters_numpy(model_b)
    a = read_tree(tree_a).step(0)
    assert a.tensors["mlp.linear_fc1:param.weight"].shape == (256, 64)  # [gate; up] rows, torch [out, in]
    assert loaded["gate_proj.weight"].shape == (64, 128)  # Paddle [in, out]
    expected = run_demo.paddle_weights_from(tree_a, tensor_map)
    assert sorted(expected) == sorted(loaded)
    for name, array in expected.items():
        assert loaded[name].dtype == array.dtype and loaded[name].tobytes() == array.tobytes(), name
    # and the other way: B's captured parameters, put in A's names and layouts, are A's bytes
    b_in_a = tensor_map.to_a(read_tree(tree_b).step(0)).tensors
    params = [name for name in a.tensors if ":param." in name]
    assert len(params) == 4
    for name in params:
        assert np.asarray(b_in_a[name]).tobytes() == np.asarray(a.tensors[name]).tobytes(), name


def test_first_divergence_is_the_swiglu_output(demo):
    """Eager Megatron rounds after every op of its bias SwiGLU, the fused variant once: the projections
    agree bit for bit, the first tensor that differs is the activation's output (linear_fc2's input)."""
    run_demo, tensor_map, tree_a, tree_b, _ = demo
    from harness.compare.tree import compare_trees

    comparison = compare_trees(tree_a, tree_b, tensor_map)
    _, record, result = run_demo.first_divergence(comparison, tensor_map)
    assert (result.name, record.phase, record.type) == ("mlp.linear_fc2#0:input.0", "forward", "RowParallelLinear")
    results = {r.name: r.pair for step in comparison.steps for r in step.comparison.tensors}
    assert results["mlp.linear_fc1#0:output.0"].bitwise and results["mlp.linear_fc1#0:input.0"].bitwise
    stats = results["mlp.linear_fc2#0:input.0"].values.stats
    assert stats.differing > 0 and stats.max_ulp <= 2  # README: 1620 of 4096 differ, max 2 ULP


def test_replay_tells_inherited_from_own(demo):
    """linear_fc1's output gradient differs in the captures (it comes from the SwiGLU), but replayed on
    A's input and weights gate_proj/up_proj make A's output bit for bit: inherited. The model around the
    SwiGLU, replayed on A's input, still differs: the difference is its own."""
    run_demo, tensor_map, tree_a, tree_b, model_b = demo
    from harness.capture.replay import replay
    from harness.compare.tree import compare_trees

    results = {r.name: r.pair for step in compare_trees(tree_a, tree_b, tensor_map).steps for r in step.comparison.tensors}
    assert not results["mlp.linear_fc1#0:grad_output.0"].bitwise
    fc1 = replay(run_demo.modules_of(model_b, "mlp.linear_fc1", tensor_map), tree_a, "mlp.linear_fc1", tensor_map)
    assert fc1.verdict == "inherited" and fc1.modules_b == ["gate_proj", "up_proj"]
    assert [pair.name for pair in fc1.outputs] == ["mlp.linear_fc1#0:output.0"]
    root = replay(model_b, tree_a, "(root)", tensor_map)
    assert root.verdict == "differs" and root.first_difference.name == "(root)#0:output.0"
    fc2 = replay(run_demo.modules_of(model_b, "mlp.linear_fc2", tensor_map), tree_a, "mlp.linear_fc2", tensor_map)
    assert fc2.verdict == "no counterpart"  # down_proj adds its bias, linear_fc2 hands it on


@pytest.mark.slow
def test_compiled_megatron_matches_fused_variant_bitwise(tmp_path):
    """Production Megatron (torch.compile'd bias SwiGLU) vs the fused_bias_swiglu variant: every captured
    tensor bitwise equal (README); the other variants differ, first at linear_fc1's output."""
    sys.path.insert(0, str(DEMO))
    import run_demo

    from harness.capture.mapping import load_map
    from harness.compare.tree import compare_trees

    tensor_map = load_map(DEMO / "map.yaml")
    tree_a = run_demo.capture_megatron(tmp_path / "megatron")
    for variant, first in (("fused_bias_swiglu", None), ("per_op", "mlp.linear_fc1#0:output.0"),
                           ("layer_fp32", "mlp.linear_fc1#0:output.0")):
        run_demo.capture_paddle(tmp_path / variant, tree_a, variant, tensor_map)
        comparison = compare_trees(tree_a, tmp_path / variant, tensor_map)
        found = run_demo.first_divergence(comparison, tensor_map)
        assert (found and found[2].name) == first, variant
        if first is None:
            assert run_demo.summary(comparison, tensor_map) == {}


@pytest.mark.slow
def test_demo_script_runs(tmp_path, capsys):
    sys.path.insert(0, str(DEMO))
    import run_demo

    assert run_demo.main(["--out", str(tmp_path)]) == 0
    assert "megatron compiled vs paddle fused_bias_swiglu: bitwise equal" in capsys.readouterr().out
