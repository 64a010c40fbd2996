"""The tensor-parallel MLP demo (examples/mlp_tensor_parallel): the megatron-core MLP captured at TP=2 (two
spawned processes, gloo) and at TP=1 from the same weights, the TP=2 tree put together in TP=1 shapes by the
map's shards and compared. Spawning two Megatron processes takes over 20 s here: slow."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("in_process_frameworks")]

DEMO = Path(__file__).resolve().parent.parent / "examples" / "mlp_tensor_parallel"


def test_tp2_megatron_mlp_against_tp1(tmp_path):
    sys.path.insert(0, str(DEMO))
    import run_tp

    from harness.capture.mapping import load_map
    from harness.compare.tree import _step, compare_trees
    from harness.store.tree import read_tree

    canonical = run_tp.canonical_parameters()
    tp1 = run_tp.capture_tp(tmp_path / "tp1", 1, canonical)
    tp2 = run_tp.capture_tp(tmp_path / "tp2", 2, canonical)
    tensor_map = load_map(run_tp.MAP_TP)
    tree2 = read_tree(tp2)
    assert sorted(tree2.ranks) == [0, 1] and not read_tree(tp1).ranks
    assert tree2.ranks[0].step(0).tensors["mlp.linear_fc1:param.weight"].shape == (128, 64)  # [gate_r; up_r]
    whole, assembled = read_tree(tp1).step(0), _step(tree2, 0, "b", tensor_map)
    assert assembled.meta["replicas_differ"] == {}
    for name in whole.names:
        assert assembled.tensors[name].shape == whole.tensors[name].shape, name
    comparison = compare_trees(tp1, tp2, tensor_map)
    results = {r.name: r.pair for step in comparison.steps for r in step.comparison.tensors}
    # the same weights; each rank's gradient rows/columns are the TP=1 GEMM's (no sum across ranks): bitwise
    for name in ("mlp.linear_fc1:param.weight", "mlp.linear_fc1:param.bias", "mlp.linear_fc2:param.weight",
                 "mlp.linear_fc1:grad.weight", "mlp.linear_fc1:grad.bias", "mlp.linear_fc2:grad.weight",
                 "mlp.linear_fc1#0:output.0", "mlp.linear_fc2#0:input.0", "mlp.linear_fc1#0:grad_output.0"):
        assert results[name].bitwise, name
    assert np.array_equal(whole.tensors["mlp.linear_fc1:param.weight"], assembled.tensors["mlp.linear_fc1:param.weight"])
    # the row-parallel output sums two partial products (an all-reduce): not TP=1's bits, named by the tool
    divergence = comparison.divergence
    assert divergence is not None
    assert (divergence.name, divergence.module, divergence.module_type, divergence.phase) == (
        "mlp.linear_fc2#0:output.0", "mlp.linear_fc2", "RowParallelLinear", "forward")
    assert not results["mlp.linear_fc2#0:output.0"].bitwise
