"""megatron-core layers at a parallel size N (TP=N for the TransformerLayer, EP=N for the MoE layer) against
the same layer at size 1, from the same weights: captured per rank (digest and full), put together in the
canonical layout through the map's shards, compared, the first divergence named and each differing tensor
classed as `xfalign compare` classes it (harness.compare.origins: where a module's inputs and parameters are
bitwise equal but its output is not, the module itself made the difference, an origin; else the difference was
handed on from an earlier one).

    python3 examples/parallel_layers/run_parallel.py [--layer layer|moe] [--size 2] [--backend gloo|nccl]
        [--device cpu|cuda] [--dtype fp32|bf16] [--repeat 3] [--deterministic on|off] [--bench] [--out DIR]

Each run is its own processes (torch.multiprocessing spawn, one per rank, a FileStore rendezvous; on CUDA
rank r on cuda:r). The weights are drawn once in the canonical (size 1) layout; each rank loads its piece,
cut by the same map that puts the pieces back together (map_tp.yaml: TensorMap.sharding). A run captures
one training step (forward + backward) twice, in digest mode and in full. --repeat R runs everything R
times (fresh processes each time) and lists the tensors whose bits vary between runs. --deterministic on:
torch.use_deterministic_algorithms(True), TransformerConfig.deterministic_mode, and for NCCL
NCCL_ALGO=Ring and CUBLAS_WORKSPACE_CONFIG=:4096:8 (what Megatron's --deterministic-mode asks for).
--bench times a step without capture, with capture in digest mode (md5, fast) and in full on every rank,
interleaved as scripts/bench_capture.py does (medians per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MAPS = {"layer": HERE / "map_tp.yaml", "moe": HERE / "map_ep.yaml"}
GROUP = {"layer": "TP", "moe": "EP"}
BENCH_VARIANTS = (None, ("digest", "md5"), ("digest", "fast"), ("full", "md5"))


@dataclass
class Job:
    """What every rank of one run does."""

    layer: str
    size: int
    backend: str
    device: str
    dtype: str
    dims: dict  # hidden, heads, ffn
    canonical: dict  # parameter name -> array (the size-1 layout)
    inputs: dict  # x, grad_out (the size-1 layout)
    captures: list = field(default_factory=list)  # [(path, mode)]
    deterministic: bool = False
    bench: tuple[int, int] = (0, 0)  # rounds, steps per round
    results: str = ""  # a folder for each rank's bench timings


def parameter_tensor(name: str) -> str:
    """A parameter's name in a capture: `module.path:param.leaf`."""
    module, _, leaf = name.rpartition(".")
    return f"{module}:param.{leaf}"


def rank_piece(tensor_map, name: str, array, rank: int, world: int):
    """Rank `rank`'s piece of the canonical `array`, tensor `name` of the parallel side (B), as the map splits it."""
    from harness.sharding import Sharding

    return (tensor_map.sharding("b", name) or Sharding()).shard(array, rank, world)


def rank_parameters(tensor_map, canonical: dict, names: list[str], rank: int, world: int) -> dict:
    """Rank `rank`'s parameters `names` cut from the canonical ones through the map: a split one's piece,
    or for a local expert the canonical expert it is (the map's rename)."""
    pieces = {}
    for name in names:
        sharding = tensor_map.sharding("b", parameter_tensor(name))
        if sharding is not None and sharding.rename is not None:
            pieces[name] = canonical[sharding.rename(rank).replace(":param.", ".")].copy()
        else:
            pieces[name] = rank_piece(tensor_map, parameter_tensor(name), canonical[name], rank, world)
    return pieces


def _rank(rank: int, job: Job, store: str) -> None:
    warnings.filterwarnings("ignore")
    import layers
    import torch
    from megatron.core import parallel_state

    from harness.capture import capture
    from harness.capture.mapping import load_map

    if job.deterministic:
        torch.use_deterministic_algorithms(True)
    device = "cpu"
    if job.device == "cuda":  # more ranks than GPUs (gloo only: NCCL refuses two ranks on one GPU) share them
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    torch.compiler.set_stance("force_eager")
    torch.distributed.init_process_group(job.backend, store=torch.distributed.FileStore(store, job.size), rank=rank,
                                         world_size=job.size)
    tp, ep = (job.size, 1) if job.layer == "layer" else (1, job.size)
    try:
        parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep, create_gloo_process_groups=False)
        layers.cpu_adaptations(job.device)
        model = layers.build(job.layer, dtype=layers.DTYPES[job.dtype], tp=tp, ep=ep, deterministic=job.deterministic,
                             **job.dims).to(device)
        tensor_map = load_map(MAPS[job.layer])
        layers.load_parameters(model, rank_parameters(tensor_map, job.canonical, [name for name, _ in model.named_parameters()],
                                                               rank, job.size))
        inputs = {key: rank_piece(tensor_map, "(root)#0:input.0", array, rank, job.size)
                  for key, array in job.inputs.items()}
        provenance = (f"examples/parallel_layers megatron-core {job.layer} at {GROUP[job.layer]}={job.size}, {job.dtype}, "
                      f"{job.device} {job.backend}, deterministic {'on' if job.deterministic else 'off'}")
        for path, mode in job.captures:
            with capture(model, path, mode=mode, side=f"megatron-{GROUP[job.layer].lower()}{job.size}",
                         provenance=provenance) as cap:
                layers.step(model, job.layer, inputs, device)
                cap.step()
        if job.bench[0]:
            times = bench(model, job, inputs, device, Path(job.results) / f"trees-{rank}")
            Path(job.results, f"bench-{rank}.json").write_text(json.dumps(times))
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def bench(model, job: Job, inputs: dict, device: str, folder: Path) -> dict:
    """Seconds per step of each variant (BENCH_VARIANTS), over job.bench rounds of consecutive steps, the
    variants taking turns (a different one first each round); a captured round's clock stops when its
    capture has written its last step."""
    import layers
    import torch

    from harness.capture import capture

    rounds, steps = job.bench

    def timed(variant) -> float:
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        if variant is None:
            start = time.perf_counter()
            for _ in range(steps):
                layers.step(model, job.layer, inputs, device)
                sync()
            return (time.perf_counter() - start) / steps
        mode, hash_ = variant
        with capture(model, folder / f"{mode}-{hash_}", mode=mode, hash=hash_) as cap:
            start = time.perf_counter()
            for _ in range(steps):
                layers.step(model, job.layer, inputs, device)
                cap.step()
                sync()
        return (time.perf_counter() - start) / steps

    times: dict[str, list[float]] = {variant_label(v): [] for v in BENCH_VARIANTS}
    for variant in BENCH_VARIANTS:  # warm-up
        timed(variant)
    for round_ in range(rounds):
        turn = round_ % len(BENCH_VARIANTS)
        for variant in BENCH_VARIANTS[turn:] + BENCH_VARIANTS[:turn]:
            torch.distributed.barrier()  # the ranks start each variant together
            times[variant_label(variant)].append(timed(variant))
    return times


def variant_label(variant) -> str:
    return "no capture" if variant is None else f"{variant[0]} {variant[1]}" if variant[0] == "digest" else "full"


def spawn(job: Job) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(job, str(Path(folder) / "store")), nprocs=job.size, join=True)


def canonical_parameters(layer: str, dtype: str, dims: dict) -> dict:
    """The layer's parameters in the size-1 layout, drawn in a one-process group."""
    import layers

    from harness.frameworks.megatron_group import one_process_group

    with one_process_group("cpu"):
        return layers.draw_parameters(layers.build(layer, dtype=layers.DTYPES[dtype], **dims))


# --- the comparisons -------------------------------------------------------------------------------------


def assembled(tree_path: Path, side: str, tensor_map):
    """Step 0 of a tree, its ranks put together in the canonical layout (harness.store.ranks)."""
    from harness.store.ranks import assemble_step
    from harness.store.tree import read_tree

    tree = read_tree(tree_path)
    if not tree.ranks:
        return tree.step(0)
    return assemble_step([tree.ranks[rank].step(0) for rank in sorted(tree.ranks)],
                         lambda name: tensor_map.sharding(side, name))


def compare_runs(one: Path, many: Path, tensor_map) -> dict:
    """Size 1 (A) against size N (B), in the canonical layout: the first divergence and, for each tensor that
    differs, its differing elements, max ULP and whether its module made the difference (an origin:
    harness.compare.origins, as `xfalign compare` marks it)."""
    from harness.compare.tree import compare_trees

    comparison = compare_trees(one, many, tensor_map)
    results = {r.name: r.pair for step in comparison.steps for r in step.comparison.tensors}
    origins = {name: origin for step in comparison.steps for name, origin in step.origins.items()}
    equal = {name for name, pair in results.items() if pair.bitwise}
    differ: dict[str, dict] = {}
    for name, pair in results.items():
        if name in equal:
            continue
        values, origin = pair.values, origins.get(name)
        entry = {"differing": None, "elements": None, "max_ulp": None, "origin": origin is not None and origin.origin,
                 "module_type": origin and origin.module_type}
        if values is not None:
            entry.update(differing=values.stats.differing, elements=values.stats.elements, max_ulp=values.stats.max_ulp)
        differ[name] = entry
    first = comparison.divergence
    step = assembled(many, "b", tensor_map)
    return {"first_divergence": None if first is None else {"name": first.name, "module": first.module,
                                                           "type": first.module_type, "phase": first.phase},
            "compared": len(results), "bitwise": len(equal), "differ": differ,
            "replicas_differ": step.meta.get("replicas_differ", {}), "left_out": getattr(step, "left_out", {})}


def varying(runs: list[Path]) -> list[str]:
    """The tensors whose bits differ between run 0 and any other run (each rank compared with itself)."""
    from harness.compare.tree import compare_trees

    found: dict[str, None] = {}
    for other in runs[1:]:
        comparison = compare_trees(runs[0], other, None)
        for step in comparison.steps:
            for result in step.comparison.tensors:
                if not result.pair.bitwise:
                    found[f"{step.label.split('/')[0] + '/' if '/' in step.label else ''}{result.name}"] = None
    return list(found)


EXPLANATIONS = {
    "RowParallelLinear": "a row-parallel GEMM: each rank multiplies its slice of the inner dimension and an "
                         "all-reduce sums the partial products, a different summation order than one GEMM over "
                         "the whole inner dimension",
    "ColumnParallelLinear": "a column-parallel GEMM: each rank's GEMM has fewer output columns (another shape), "
                            "for which the kernel may block the inner sum differently",
    "TopKRouter": "the router's gating GEMM runs on the rank's own tokens only (another shape: s*b/N rows), for "
                  "which the GEMM kernel may sum differently; its softmax and top-k work token by token",
}


def report(args, out: Path, dims: dict, results: dict) -> str:
    import megatron.core
    import torch

    lines = [f"megatron-core {megatron.core.__version__}, torch {torch.__version__}, {args.backend} on {args.device}, "
             f"{args.dtype}, {args.layer} {dims}, seq {args.seq}, batch {args.batch}, deterministic {args.deterministic}, "
             f"{args.repeat} run(s) each"]
    group = GROUP[args.layer]
    for index, comparison in enumerate(results["comparisons"]):
        first = comparison["first_divergence"]
        lines.append(f"run {index}: {group}=1 vs {group}={args.size}: {comparison['bitwise']} of {comparison['compared']} "
                     "tensors bitwise equal; first divergence: " + ("none" if first is None else
                     f"{first['name']} ({first['phase']} of {first['module']}, {first['type']})"))
        if comparison["replicas_differ"]:
            lines.append(f"    replicas that differ between ranks: {comparison['replicas_differ']}")
        if index:
            continue
        for name, entry in comparison["differ"].items():
            origin = ""
            if entry["origin"]:
                origin = "  <- origin: " + EXPLANATIONS.get(entry.get("module_type") or "", f"{entry.get('module_type')}")
            lines.append(f"    {name}: {entry['differing']} of {entry['elements']} differ, max {entry['max_ulp']} ULP{origin}")
    for label, names in results["varying"].items():
        lines.append(f"varying between runs ({label}): " + (", ".join(names) if names else "none"))
    for rank, times in results.get("bench", {}).items():
        plain = statistics.median(times["no capture"])
        lines.append(f"capture overhead, {group}={args.size} rank {rank}: " + "; ".join(
            f"{label} {statistics.median(t) * 1e3:.1f} ms (x{statistics.median(t) / plain:.2f}, "
            f"{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f})" for label, t in times.items()))
    lines.append(f"trees in {out}")
    return "\n".join(lines)


def run(args) -> dict:
    """Every run of the comparison (and the bench); the results as a dict (also report.json in args.out)."""
    import layers

    from harness.capture.mapping import load_map

    out = Path(args.out)
    if args.deterministic == "on":
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    dims = dict(hidden=args.hidden, heads=args.heads, ffn=args.ffn)
    dtype = layers.DTYPES[args.dtype]
    canonical = canonical_parameters(args.layer, args.dtype, dims)
    inputs = layers.draw_inputs(args.seq, args.batch, args.hidden, dtype)
    tensor_map = load_map(MAPS[args.layer])
    trees: dict[int, list[Path]] = {1: [], args.size: []}
    comparisons = []
    for repeat in range(args.repeat):
        for size in (1, args.size):
            folder = out / f"run-{repeat}" / f"{GROUP[args.layer].lower()}{size}"
            job = Job(args.layer, size, args.backend, args.device, args.dtype, dims, canonical, inputs,
                      [(folder / "digest", "digest"), (folder / "full", "full")], args.deterministic == "on")
            spawn(job)
            trees[size].append(folder / "full")
        comparisons.append(compare_runs(trees[1][-1], trees[args.size][-1], tensor_map))
    results: dict = {"comparisons": comparisons,
                     "varying": {f"{GROUP[args.layer]}={size}": varying(paths) for size, paths in trees.items()}}
    if args.bench:
        with tempfile.TemporaryDirectory() as folder:
            spawn(Job(args.layer, args.size, args.backend, args.device, args.dtype, dims, canonical, inputs,
                      deterministic=args.deterministic == "on", bench=(args.rounds, args.steps), results=folder))
            results["bench"] = {rank: json.loads(Path(folder, f"bench-{rank}.json").read_text())
                                for rank in range(args.size)}
    (out / "report.json").write_text(json.dumps(results, indent=1, default=str))
    return results


def parser() -> argparse.ArgumentParser:
    import layers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer", choices=("layer", "moe"), default="layer",
                   help="the TransformerLayer at TP=size, or the MoE layer at EP=size")
    p.add_argument("--size", type=int, default=2, help="the tensor- or expert-parallel size")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(layers.DTYPES), default="fp32")
    p.add_argument("--hidden", type=int, default=layers.HIDDEN)
    p.add_argument("--heads", type=int, default=layers.HEADS)
    p.add_argument("--ffn", type=int, default=layers.FFN)
    p.add_argument("--seq", type=int, default=layers.SEQ)
    p.add_argument("--batch", type=int, default=layers.BATCH)
    p.add_argument("--repeat", type=int, default=1, help="runs of each size (fresh processes each)")
    p.add_argument("--deterministic", choices=("on", "off"), default="off")
    p.add_argument("--bench", action="store_true", help="also time the capture's overhead per rank")
    p.add_argument("--rounds", type=int, default=5, help="--bench: rounds per variant")
    p.add_argument("--steps", type=int, default=2, help="--bench: steps per round")
    p.add_argument("--out", type=Path, default=None, help="folder for the trees (default: a temporary one)")
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    args = parser().parse_args(argv)
    if args.size < 1 or args.repeat < 1:
        print("run_parallel: --size and --repeat are at least 1", file=sys.stderr)
        return 2
    if args.backend == "nccl" and args.device != "cuda":
        print("run_parallel: --backend nccl needs --device cuda", file=sys.stderr)
        return 2
    if args.layer == "moe" and args.device != "cuda":
        print("run_parallel: megatron-core's MoE layer needs CUDA (its all-to-all dispatcher makes a "
              "torch.cuda.Stream when built, its router moves a CPU weight to CUDA): --device cuda", file=sys.stderr)
        return 2
    args.out = args.out or Path(tempfile.mkdtemp(prefix=f"xfalign-parallel-{args.layer}-"))
    dims = dict(hidden=args.hidden, heads=args.heads, ffn=args.ffn)
    print(report(args, args.out, dims, run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
