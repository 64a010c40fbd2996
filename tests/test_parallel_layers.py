"""examples/parallel_layers: a megatron-core TransformerLayer (local spec) at TP=2 against TP=1 from the same
weights, two spawned processes over gloo on the CPU, captured in digest and full mode, put together in the
canonical layout by map_tp.yaml's shards and compared. Spawning the Megatron processes takes over 20 s each
here: the end-to-end tests are slow. (The MoE layer at EP=2 needs CUDA: only its refusal on the CPU is tested.)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "parallel_layers"
DIMS = dict(hidden=32, heads=4, ffn=64)


@pytest.fixture(scope="module")
def run_parallel():
    sys.path.insert(0, str(EXAMPLE))
    import run_parallel

    return run_parallel


@pytest.fixture(scope="module")
def runs(run_parallel, tmp_path_factory):
    """Two runs of each size and a one-round bench, at tiny sizes."""
    out = tmp_path_factory.mktemp("parallel")
    args = argparse.Namespace(layer="layer", size=2, backend="gloo", device="cpu", dtype="fp32", seq=8, batch=2,
                              repeat=2, deterministic="off", bench=True, rounds=1, steps=1, out=out, **DIMS)
    return out, run_parallel.run(args)


def _steps(run_parallel, out: Path):
    from harness.capture.mapping import load_map
    from harness.store.tree import read_tree

    tensor_map = load_map(run_parallel.MAPS["layer"])
    tp1 = read_tree(out / "run-0" / "tp1" / "full").step(0)
    return tp1, run_parallel.assembled(out / "run-0" / "tp2" / "full", "b", tensor_map), tensor_map


@pytest.mark.slow
def test_replicas_agree_and_the_weights_assemble_to_the_tp1_weights(run_parallel, runs):
    out, _ = runs
    tp1, tp2, _ = _steps(run_parallel, out)
    assert tp2.meta["world"] == 2 and tp2.meta["replicas_differ"] == {} and tp2.left_out == {}
    assert tp2.tensors["self_attention.linear_qkv:param.weight"].shape == tp1.tensors[
        "self_attention.linear_qkv:param.weight"].shape
    assert sorted(tp2.names) == sorted(tp1.names)
    params = [name for name in tp1.names if ":param." in name]
    assert len(params) == 6
    for name in params:  # each rank was cut from the TP=1 weights by the map that puts them back
        assert tp2.tensors[name].tobytes() == tp1.tensors[name].tobytes(), name


@pytest.mark.slow
def test_the_first_divergence_is_the_row_parallel_all_reduce(run_parallel, runs):
    """Before linear_proj's output every op computes each element as TP=1 does (norms, the column-parallel
    GEMM's rows, per-head attention): bitwise. linear_proj sums two partial GEMMs (an all-reduce)."""
    _, results = runs
    for comparison in results["comparisons"]:
        first = comparison["first_divergence"]
        assert (first["name"], first["type"], first["phase"]) == (
            "self_attention.linear_proj#0:output.0", "RowParallelLinear", "forward")
        differ = comparison["differ"]
        for name in ("self_attention.linear_qkv#0:output.0", "self_attention.core_attention#0:output.0",
                     "self_attention.linear_proj#0:input.0", "input_layernorm#0:output.0"):
            assert name not in differ, name
        assert differ["self_attention.linear_proj#0:output.0"]["origin"]


@pytest.mark.slow
def test_the_row_parallel_output_is_within_the_summation_error_bound(run_parallel, runs):
    """Each of the two sums of K products is within K*u*(|x|@|W|^T) of the exact one (u = eps/2, any order of
    summation), so the two differ by at most K*eps*(|x|@|W|^T): holds for any seed, unlike a measured max."""
    out, _ = runs
    tp1, tp2, _ = _steps(run_parallel, out)
    x = tp1.tensors["self_attention.linear_proj#0:input.0"].astype(np.float64)
    w = tp1.tensors["self_attention.linear_proj:param.weight"].astype(np.float64)
    assert tp2.tensors["self_attention.linear_proj#0:input.0"].tobytes() == tp1.tensors[
        "self_attention.linear_proj#0:input.0"].tobytes()
    bound = w.shape[1] * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T)
    difference = np.abs(tp2.tensors["self_attention.linear_proj#0:output.0"].astype(np.float64)
                        - tp1.tensors["self_attention.linear_proj#0:output.0"])
    assert (difference <= bound).all()


@pytest.mark.slow
def test_digest_trees_leave_split_tensors_out_and_compare_replicas(run_parallel, runs):
    out, _ = runs
    from harness.capture.mapping import load_map

    step = run_parallel.assembled(out / "run-0" / "tp2" / "digest", "b", load_map(run_parallel.MAPS["layer"]))
    assert "digest-only" in step.left_out["self_attention.linear_qkv:param.weight"]
    assert "input_layernorm:param.weight" in step.unstored and step.meta["replicas_differ"] == {}


@pytest.mark.slow
def test_repeats_and_bench_report_per_tensor_and_per_rank(run_parallel, runs):
    out, results = runs
    from harness.store.tree import read_tree

    names = set(read_tree(out / "run-0" / "tp1" / "full").step(0).names)
    assert set(results["varying"]) == {"TP=1", "TP=2"}
    for label, varying in results["varying"].items():
        assert all(name.split("/")[-1] in names for name in varying), label
    assert sorted(results["bench"]) == [0, 1]
    for times in results["bench"].values():
        assert list(times) == ["no capture", "digest md5", "digest fast", "full"]
        assert all(len(t) == 1 and t[0] > 0 for t in times.values())
    assert (out / "report.json").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--layer", "moe"], "needs CUDA"),
    (["--backend", "nccl"], "needs --device cuda"),
    (["--repeat", "0"], "at least 1"),
])
def test_runs_that_cannot_be_made_are_refused_in_one_line(run_parallel, capsys, argv, message):
    assert run_parallel.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.slow
def test_ep2_moe_against_ep1_on_a_gpu(run_parallel, tmp_path):
    """The MoE layer needs CUDA: EP=2 over gloo (both ranks may share one GPU) against EP=1. The experts'
    weights are filed under their global numbers, the layer's input cut by token blocks, and where the routing
    map is the same every expert receives EP=1's tokens in EP=1's order (the map's ragged join)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("megatron-core's MoE layer needs CUDA")
    from harness.capture.mapping import load_map
    from harness.store.tree import read_tree

    args = argparse.Namespace(layer="moe", size=2, backend="gloo", device="cuda", dtype="fp32", seq=8, batch=2,
                              repeat=1, deterministic="off", bench=False, out=tmp_path, **DIMS)
    comparison = run_parallel.run(args)["comparisons"][0]
    ep1 = read_tree(tmp_path / "run-0" / "ep1" / "full").step(0)
    ep2 = run_parallel.assembled(tmp_path / "run-0" / "ep2" / "full", "b", load_map(run_parallel.MAPS["moe"]))
    assert ep2.meta["replicas_differ"] == {} and ep2.left_out == {} and sorted(ep2.names) == sorted(ep1.names)
    for name in [n for n in ep1.names if ":param." in n] + ["(root)#0:input.0", "router#0:input.0"]:
        assert ep2.tensors[name].tobytes() == ep1.tensors[name].tobytes(), name
    if "router#0:output.1" not in comparison["differ"]:  # the same routing: the same tokens to each expert
        assert "experts#0:input.0" not in comparison["differ"]
        assert not any(name.startswith("experts.local_experts.") and name.endswith(":input.0")
                       for name in comparison["differ"])
