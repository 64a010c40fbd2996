"""Op cases at tensor_parallel > 1 (issue 21): the Megatron side runs on N rank workers (real
Column/RowParallelLinear, torch.distributed over gloo), each rank's dump is kept, the canonical (TP=1 layout)
dump is assembled from them and compared; replicas are checked bit for bit; a rank that crashes or hangs
fails that case only and takes its whole world with it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from harness.compare.case import compare_dumps
from harness.compare.findings import ReplicasDiffer
from harness.errors import SideCrashed
from harness.load import load_cases
from harness.run_options import RunOptions
from harness.runner import WorkerPool, run_case
from harness.sharding import Sharding
from harness.store.dump import Dump, DumpError
from harness.store.ranks import assemble_dumps, rank_dump_dir

CASE = """\
description: "tensor-parallel linear, small"
op: linear
vars: {rows: 8, in_features: 64, out_features: 32}
options: {bias: true, tensor_parallel: 2, parallel: %(parallel)s}
seed: 5
inputs:
  x: {shape: [rows, in_features], dtype: bfloat16}
  weight: {shape: [out_features, in_features], dtype: bfloat16, std: 0.05}
  bias: {shape: [out_features], dtype: bfloat16, std: 0.5}
  grad_out: {shape: [rows, out_features], dtype: bfloat16}
sides:
  megatron: {framework: megatron, impl: %(impl)s, mode: eager}
  paddle: {framework: paddle, impl: tp_sharded}
expect:
  all: report
"""

# a Megatron-side user function: the real ColumnParallelLinear, with a fault on rank 1
FAULTY = """\
import os, time
from pathlib import Path

import torch

from harness.ops.linear.megatron import LinearMegatron


def linear(x, weight, bias, options):
    rank = torch.distributed.get_rank()
    (Path(__file__).parent / f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == 1:
%(fault)s
    return LinearMegatron.megatron(x, weight, bias, options)
"""


def write_case(folder: Path, parallel: str = "column", impl: str = "megatron", fault: str = "pass") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faulty.py").write_text(FAULTY % {"fault": f"        {fault}"})
    path = folder / f"{parallel}.yaml"
    path.write_text(CASE % {"parallel": parallel, "impl": impl})
    return path


def test_megatron_runs_on_two_ranks_and_is_compared_in_the_canonical_layout(tmp_path):
    with WorkerPool(jobs=2) as pool:
        for parallel in ("column", "row"):
            [case] = load_cases(write_case(tmp_path / parallel, parallel))
            dumps = {side: tmp_path / parallel / "dumps" / side for side in case.sides}
            run = run_case(case, dumps, RunOptions(reference=False), pool)
            assert run.comparison is not None
            megatron, paddle = run.dumps["megatron"], run.dumps["paddle"]
            # the canonical tensors have the TP=1 shapes, as the one-process Paddle side's do
            assert {n: t.shape for n, t in megatron.tensors.items()} == {n: t.shape for n, t in paddle.tensors.items()}
            assert megatron.meta["world"] == 2 and megatron.meta["replicas_differ"] == {}
            assert not [f for r in run.comparison.tensors for f in r.findings if isinstance(f.data, ReplicasDiffer)]
            ranks = [Dump.read(rank_dump_dir(dumps["megatron"], rank)) for rank in range(2)]
            split = 0 if parallel == "column" else 1  # the weight's split: output features, or input features
            for rank, piece in enumerate(ranks):
                assert piece.meta["rank"] == rank
                whole = megatron.tensors["grad.weight"]
                assert piece.tensors["grad.weight"].shape[split] == whole.shape[split] // 2
            # each rank's piece is its part of the canonical tensor, replicas are alike on both ranks
            shardings = {"column": {"out": Sharding(-1), "grad.weight": Sharding(0), "grad.x": Sharding()},
                         "row": {"out": Sharding(), "grad.weight": Sharding(1), "grad.x": Sharding(-1)}}[parallel]
            for name, sharding in shardings.items():
                for rank, piece in enumerate(ranks):
                    assert piece.tensors[name].tobytes() == sharding.shard(megatron.tensors[name], rank, 2).tobytes()
            assert megatron.input_digests == paddle.input_digests  # each rank's piece stood for the whole input


def test_replicas_that_differ_between_ranks_fail_the_comparison(tmp_path):
    """Rank 1's copy of an all-reduced output differs by one bit: a failing replicas-differ finding."""
    with WorkerPool(jobs=2) as pool:
        [case] = load_cases(write_case(tmp_path, "row"))
        dumps = {side: tmp_path / "dumps" / side for side in case.sides}
        run = run_case(case, dumps, RunOptions(reference=False), pool)
    ranks = [Dump.read(rank_dump_dir(dumps["megatron"], rank)) for rank in range(2)]
    out = ranks[1].tensors["out"].copy()
    out.view(np.uint16)[0, 0] ^= 1
    ranks[1] = Dump(ranks[1].meta, dict(ranks[1].tensors, out=out), directory=ranks[1].directory)
    shardings = {"x": Sharding(-1), "weight": Sharding(1)}
    tampered = assemble_dumps(ranks, shardings)
    assert tampered.meta["replicas_differ"] == {"out": [1]}
    tampered.write(tmp_path / "tampered")
    comparison = compare_dumps(Dump.read(tmp_path / "tampered"), run.dumps["paddle"])
    [out_result] = [r for r in comparison.tensors if r.pair.name == "out"]
    assert not out_result.holds and comparison.status == "fail"
    assert [f.data.ranks for f in out_result.findings if isinstance(f.data, ReplicasDiffer)] == [[1]]
    with pytest.raises(DumpError, match="rank 0 of 2, expected rank 1 of 2"):
        assemble_dumps([ranks[0], ranks[0]], shardings)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("fault, message", [("os._exit(3)", "rank 1 exited before writing its dump"),
                                            ("time.sleep(600)", r"timed out after 15 s \(ranks (0, )?1 of 2 had not finished")])
def test_a_rank_that_crashes_or_hangs_fails_its_case_and_ends_its_world(tmp_path, fault, message):
    with WorkerPool(jobs=2) as pool:
        [good] = load_cases(write_case(tmp_path / "good", impl="faulty.py:linear"))
        run_case(good, None, RunOptions(reference=False), pool)  # the world is up: the timeout is the case's own
        warm = [int((tmp_path / "good" / f"rank{rank}.pid").read_text()) for rank in range(2)]
        [bad] = load_cases(write_case(tmp_path / "bad", impl="faulty.py:linear", fault=fault))
        with pytest.raises(SideCrashed, match=message):
            run_case(bad, None, RunOptions(reference=False, timeout=15), pool)
        assert [int((tmp_path / "bad" / f"rank{rank}.pid").read_text()) for rank in range(2)] == warm
        assert all(_dead(pid) for pid in warm)  # the whole world, not only the faulty rank
        run = run_case(good, None, RunOptions(reference=False), pool)  # the next case gets a fresh world
        assert run.comparison is not None and run.dumps["megatron"].meta["world"] == 2
        assert not {int((tmp_path / "good" / f"rank{rank}.pid").read_text()) for rank in range(2)} & set(warm)
