"""The released PaddleFormers LLaMA MLP (examples/mlp_alignment/paddleformers_mlp.py) against the megatron-core
MLP with no biases, fp32 on CPU, through map_llama.yaml; and PaddleFormers' LlamaDecoderLayer captured.
Skipped when PaddleFormers is not importable (scripts/setup.sh installs it with --no-deps into
build/paddleformers; XFALIGN_PADDLEFORMERS_PATH names another folder)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.xdist_group("in_process_frameworks"), pytest.mark.slow]

DEMO = Path(__file__).resolve().parent.parent / "examples" / "mlp_alignment"


@pytest.fixture(scope="module")
def pf(tmp_path_factory):
    """The example module, its map, A's capture (Megatron, compiled) and B's (PaddleFormers' MLP), made once."""
    sys.path.insert(0, str(DEMO))
    import paddleformers_mlp

    try:
        paddleformers_mlp.import_llama()
    except ImportError as error:
        pytest.skip(str(error))
    from harness.capture.mapping import load_map

    out = tmp_path_factory.mktemp("paddleformers")
    tensor_map = load_map(paddleformers_mlp.MAP)
    tree_a = paddleformers_mlp.capture_megatron(out / "megatron")
    model_b = paddleformers_mlp.capture_paddleformers(out / "paddleformers", tree_a, tensor_map)
    return paddleformers_mlp, tensor_map, tree_a, out / "paddleformers", model_b


def test_the_model_is_the_released_class(pf):
    paddleformers_mlp, _, _, _, model_b = pf
    from paddleformers.transformers.llama import modeling

    assert type(model_b) is modeling.MLP and type(model_b).__module__ == "paddleformers.nn.mlp"
    assert sorted(name for name, _ in model_b.named_sublayers()) == ["act_fn", "down_proj", "gate_proj", "up_proj"]


def test_weights_and_inputs_loaded_through_the_map_are_identical(pf):
    """B's captured parameters and its input, put in A's names and layouts by the map, are A's bytes."""
    _, tensor_map, tree_a, tree_b, _ = pf
    from harness.store.tree import read_tree

    a, b = read_tree(tree_a).step(0), read_tree(tree_b).step(0)
    assert b.tensors["gate_proj:param.weight"].shape == (64, 128)  # Paddle [in, out]
    assert b.tensors["(root)#0:input.0"].shape == (2, 16, 64)  # [b, s, h]: what LlamaDecoderLayer feeds it
    b_in_a = tensor_map.to_a(b).tensors
    names = [name for name in a.tensors if ":param." in name] + ["(root)#0:input.0", "mlp.linear_fc1#0:input.0"]
    assert len(names) == 4
    for name in names:
        assert np.asarray(b_in_a[name]).tobytes() == np.asarray(a.tensors[name]).tobytes(), name


def test_first_divergence_is_the_first_gemm_and_only_rounding(pf):
    """fp32 on both sides: the first tensor that differs is linear_fc1's output (the GEMM: Paddle's CPU
    matmul and torch's accumulate in different orders); replayed on A's input and weights the projections
    still differ (the module's own), by rounding only: both sides are as close to the float64 product."""
    paddleformers_mlp, tensor_map, tree_a, tree_b, model_b = pf
    import run_demo

    from harness.capture.replay import replay
    from harness.compare.tree import compare_trees
    from harness.store.tree import read_tree

    first = compare_trees(tree_a, tree_b, tensor_map).divergence
    assert (first.name, first.phase, first.module_type) == ("mlp.linear_fc1#0:output.0", "forward", "ColumnParallelLinear")
    fc1 = replay(run_demo.modules_of(model_b, "mlp.linear_fc1", tensor_map), tree_a, "mlp.linear_fc1", tensor_map)
    assert fc1.verdict == "differs" and fc1.modules_b == ["gate_proj", "up_proj"]
    a = run_demo.a_arrays(tree_a)
    exact = a["mlp.linear_fc1#0:input.0"].astype(np.float64) @ a["mlp.linear_fc1:param.weight"].astype(np.float64).T
    b = tensor_map.to_a(read_tree(tree_b).step(0)).tensors
    for output in (a["mlp.linear_fc1#0:output.0"], np.asarray(b["mlp.linear_fc1#0:output.0"])):
        assert np.abs(output - exact).max() < 1e-6 * np.abs(exact).max()


def test_decoder_layer_runs_and_is_captured(pf, tmp_path):
    """PaddleFormers' LlamaDecoderLayer (RMSNorm, attention with RoPE, MLP) forward and backward in fp32 on
    CPU: every module recorded, forward then backward down to the first norm, every parameter's gradient."""
    paddleformers_mlp = pf[0]
    from harness.store.tree import read_tree
    from harness.store.tree_format import CaptureInfo

    tree = paddleformers_mlp.capture_decoder_layer(tmp_path / "decoder")
    dump = read_tree(tree).step(0)
    info = CaptureInfo.model_validate(dump.meta["capture"])
    assert info.root == "LlamaDecoderLayer" and len(info.modules) == 13
    forward = [r.module for r in info.records if r.phase == "forward"]
    assert forward[0] == "input_layernorm" and forward[-1] == "(root)" and "mlp.act_fn" in forward
    assert [r.module for r in info.records if r.phase == "backward"][-1] == "input_layernorm"
    grads = {name for name in dump.tensors if ":grad." in name}
    assert len(grads) == 9 and "mlp.gate_proj:grad.weight" in grads
    assert all(np.isfinite(np.asarray(dump.tensors[name])).all() for name in grads)
