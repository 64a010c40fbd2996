"""The megatron-core MLP at TP=2 and at TP=1, from the same weights, captured and compared; and the TP=2
capture compared with the Paddle MLP (examples/mlp_alignment).

    python3 examples/mlp_tensor_parallel/run_tp.py [--out DIR]

The weights are drawn once in the canonical (TP=1) layout (megatron_mlp.demo_parameters); each rank of
the TP=2 run is given its shard of them (harness.sharding: linear_fc1's [gate_r; up_r] rows, linear_fc2's
columns). Each run is its own processes (torch.multiprocessing spawn, gloo, a FileStore rendezvous): TP=2
writes a tree with a rank-NNNNN folder per rank, TP=1 one tree. `xfalign compare TP1 TP2 --map map_tp.yaml`
puts the TP=2 steps together in TP=1 shapes (the map's `shard:`), checks the replicas bit for bit, and
compares. Megatron's bias SwiGLU runs eagerly (torch.compile in each spawned process costs minutes here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
MLP_DEMO = HERE.parent / "mlp_alignment"
MAP_TP = HERE / "map_tp.yaml"  # A: TP=1, B: TP=2
MAP_TP_PADDLE = HERE / "map_tp_paddle.yaml"  # A: TP=2, B: Paddle
sys.path[:0] = [str(HERE), str(MLP_DEMO)]

SEQ, BATCH = 16, 2


def canonical_parameters() -> dict:
    """The demo MLP's parameters in the TP=1 layout, by parameter name (drawn in a one-process group)."""
    import megatron_mlp as M

    with M.megatron_group("cpu"):
        return M.parameters_numpy(M.build_megatron_mlp())


def rank_parameters(canonical: dict, rank: int, world: int) -> dict:
    """Rank `rank`'s shards of the canonical parameters, as megatron-core's TP layers hold them."""
    from harness.sharding import Sharding

    split = {"mlp.linear_fc1.weight": Sharding(0, 2), "mlp.linear_fc1.bias": Sharding(0, 2),
             "mlp.linear_fc2.weight": Sharding(1)}  # linear_fc2.bias: whole on every rank
    return {name: split.get(name, Sharding()).shard(array, rank, world) for name, array in canonical.items()}


def _rank(rank: int, world: int, store: str, path: str, canonical: dict) -> None:
    """One rank: join the world, Megatron's TP=`world` state, its shard of the weights, one captured step."""
    warnings.filterwarnings("ignore")
    import megatron_mlp as M
    import torch
    from megatron.core import parallel_state

    from harness.capture import capture

    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(store, world), rank=rank,
                                         world_size=world)
    try:
        parallel_state.initialize_model_parallel(world, 1, create_gloo_process_groups=False)
        model = M.MLPBlock(M.mlp_config())
        M.load_parameters(model, rank_parameters(canonical, rank, world))
        with capture(model, path, side=f"megatron-tp{world}", provenance=f"examples/mlp_tensor_parallel megatron-core "
                     f"MLP at TP={world}, eager bias SwiGLU, cpu gloo") as cap:
            M.megatron_step(model, M.demo_inputs(SEQ, BATCH), eager=True)
            cap.step()
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def capture_tp(path: Path, world: int, canonical: dict | None = None) -> Path:
    """One step of the MLP at TP=`world` captured at `path` by `world` spawned processes."""
    import torch.multiprocessing as mp

    canonical = canonical if canonical is not None else canonical_parameters()
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(world, str(Path(folder) / "store"), str(path), canonical), nprocs=world, join=True)
    return path


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder for the trees (default: a temporary one)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="xfalign-mlp-tp-"))

    import run_demo

    from harness.capture.mapping import load_map
    from harness.compare.tree import compare_trees

    canonical = canonical_parameters()
    tp1, tp2 = capture_tp(out / "megatron-tp1", 1, canonical), capture_tp(out / "megatron-tp2", 2, canonical)
    paddle = out / "paddle-fused_bias_swiglu"
    run_demo.capture_paddle(paddle, tp1, "fused_bias_swiglu", load_map(MLP_DEMO / "map.yaml"))
    for label, a, b, map_path in (("megatron TP=1 vs megatron TP=2", tp1, tp2, MAP_TP),
                                  ("megatron TP=2 vs paddle fused_bias_swiglu", tp2, paddle, MAP_TP_PADDLE)):
        tensor_map = load_map(map_path)
        comparison = compare_trees(a, b, tensor_map)
        first = run_demo.first_divergence(comparison, tensor_map)
        print(f"{label}: " + ("bitwise equal" if first is None else
              f"first divergence {first[2].name} ({first[1].phase} of {first[1].module}, {first[1].type})"))
        for name, counts in run_demo.summary(comparison, tensor_map).items():
            text = "missing or not comparable" if counts is None else "{} of {} differ, max {} ULP".format(*counts)
            print(f"    {name}: {text}")
    print(f"trees in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
