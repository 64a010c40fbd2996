"""The demo end to end: a megatron-core MLP and a Paddle MLP with the same weights, one training step
captured on each side, the two captures compared through map.yaml, the first divergence named, replay of
the module where it is (and of the modules around it), each also in float64 on both sides to say which
side's output is closer to exact; then every Paddle variant against Megatron, compiled and eager.

    python3 examples/mlp_alignment/run_demo.py [--out DIR] [--megatron-tree TREE]

--megatron-tree: a Megatron capture made elsewhere (scripts/gpu_capture.sh on the H200): the Paddle side
takes its weights and inputs from it and is compared with it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MAP = HERE / "map.yaml"
sys.path.insert(0, str(HERE))

from harness.store.tree_format import ROOT, TensorName, call_tensor  # noqa: E402


def capture_megatron(path: Path, device: str = "cpu", eager: bool = False, mode: str = "full",
                     seq: int = 16, batch: int = 2, hidden: int | None = None, ffn: int | None = None,
                     hash: str = "md5") -> Path:
    """One step of the megatron-core MLP captured at `path` (every module, full tensors by default;
    `mode` and `hash` as harness.capture.capture takes them)."""
    import megatron_mlp as M

    from harness.capture import capture

    hidden, ffn = hidden or M.HIDDEN, ffn or M.FFN
    with M.megatron_group(device):
        model = M.build_megatron_mlp(hidden, ffn, device=device)
        inputs = M.demo_inputs(seq, batch, hidden)
        side = f"megatron-{device}-{'eager' if eager else 'compiled'}"
        with capture(model, path, mode=mode, hash=hash, side=side, provenance=f"examples/mlp_alignment megatron-core MLP, "
                     f"{'eager' if eager else 'compiled'} bias SwiGLU, {device}") as cap:
            M.megatron_step(model, inputs, device=device, eager=eager)
            cap.step()
    return path


def a_arrays(tree_a, step: int = 0) -> dict[str, np.ndarray]:
    """A's captured step as name -> array (stored tensors only)."""
    from harness.store.tree import read_tree

    dump = read_tree(tree_a).step(step)
    return {name: np.asarray(dump.tensors[name]) for name in dump.tensors}


def paddle_weights_from(tree_a, tensor_map, step: int = 0) -> dict[str, np.ndarray]:
    """A's parameters as the step's forward pass read them, through the map, by Paddle parameter name."""
    params_a = {name: array for name, array in a_arrays(tree_a, step).items() if ":param." in name}
    weights = {}
    for name, array in tensor_map.to_b(params_a).items():
        parsed = TensorName.parse(name)
        if parsed is None or parsed.role != "param":
            continue
        prefix = "" if parsed.module == ROOT else parsed.module + "."
        weights[prefix + parsed.slot] = array
    return weights


def step_inputs_from(tree_a, step: int = 0) -> dict[str, np.ndarray]:
    """The step's input and output gradient as A saw them ((root)'s input.0 and grad_output.0)."""
    arrays = a_arrays(tree_a, step)
    return {"x": arrays[call_tensor(ROOT, 0, "input", 0)], "grad_out": arrays[call_tensor(ROOT, 0, "grad_output", 0)]}


def capture_paddle(path: Path, tree_a, variant: str, tensor_map, mode: str = "full", hash: str = "md5"):
    """One step of the Paddle MLP (`variant`), with A's weights and inputs, captured at `path`.
    Returns the model (for replay)."""
    import paddle_mlp as P

    from harness.capture import capture

    weights = paddle_weights_from(tree_a, tensor_map)
    hidden, ffn = weights["gate_proj.weight"].shape
    model = P.build_paddle_mlp(hidden, ffn, variant)
    P.load_parameters(model, weights)
    with capture(model, path, mode=mode, hash=hash, side=f"paddle-{variant}",
                 provenance=f"examples/mlp_alignment Paddle MLP, variant {variant}") as cap:
        P.paddle_step(model, step_inputs_from(tree_a))
        cap.step()
    return model


def first_divergence(comparison, tensor_map):
    """The first tensor, in A's execution order, that differs and that the map does not ignore on A's side:
    (step label, record, tensor result), or None."""
    for step in comparison.steps:
        for record in step.records:
            for result in record.tensors:
                if not result.pair.bitwise and not tensor_map.ignored("a", result.name):
                    return step.label, record, result
    return None


def summary(comparison, tensor_map) -> dict[str, tuple[int, int, int] | None]:
    """Counts of what differs, per tensor that differs: (differing elements, elements, max ULP)."""
    differing: dict[str, tuple[int, int, int] | None] = {}
    for step in comparison.steps:
        for result in step.comparison.tensors:
            pair = result.pair
            values = pair.values
            if pair.bitwise or tensor_map.ignored("a", result.name):
                continue
            if values is None:
                differing[result.name] = None
            else:
                differing[result.name] = (values.stats.differing, values.stats.elements, values.stats.max_ulp)
    return differing


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder for the trees (default: a temporary one)")
    parser.add_argument("--megatron-tree", type=Path, default=None, help="a Megatron capture made elsewhere")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="xfalign-mlp-demo-"))

    import paddle_mlp as P

    from harness.capture.mapping import load_map
    from harness.capture.replay import replay
    from harness.compare.tree import compare_trees
    from harness.reports.text import exact_replay_lines

    tensor_map = load_map(MAP)
    trees_a = {"given": args.megatron_tree} if args.megatron_tree else {
        "compiled": capture_megatron(out / "megatron-compiled"), "eager": capture_megatron(out / "megatron-eager", eager=True)}
    for label, tree_a in trees_a.items():
        for variant in P.VARIANTS:
            tree_b = out / f"paddle-{variant}-vs-{label}"
            model_b = capture_paddle(tree_b, tree_a, variant, tensor_map)
            comparison = compare_trees(tree_a, tree_b, tensor_map)
            first = first_divergence(comparison, tensor_map)
            print(f"megatron {label} vs paddle {variant}: " + ("bitwise equal" if first is None else
                  f"first divergence {first[2].name} ({first[1].phase} of {first[1].module}, {first[1].type})"))
            for name, counts in summary(comparison, tensor_map).items():
                text = "missing or not comparable" if counts is None else "{} of {} differ, max {} ULP".format(*counts)
                print(f"    {name}: {text}")
            if first is not None:
                with megatron_model(tree_a) as model_a:
                    for module_a in _enclosing(first[1].module):
                        if not modules_of(model_b, module_a, tensor_map):
                            continue
                        result = replay(modules_of(model_b, module_a, tensor_map), tree_a, module_a, tensor_map,
                                        exact=True, model_a=model_a)
                        print(f"    replay of {module_a} on {', '.join(result.modules_b)}: {result.verdict}" +
                              _difference(result))
                        for line in exact_replay_lines(result.exact):
                            print("        " + line)
    print(f"trees in {out}")
    return 0


@contextmanager
def megatron_model(tree_a, step: int = 0) -> Iterator:
    """A's model of the sizes A's capture holds, built anew on the CPU inside the one-process group Megatron
    needs to run: replay(..., exact=True, model_a=it) runs a float64 copy of its module with A's captured
    parameters (its own are not used)."""
    import megatron_mlp as M

    weight = a_arrays(tree_a, step)["mlp.linear_fc1:param.weight"]  # [2 * ffn, hidden]
    with M.megatron_group("cpu"):
        yield M.build_megatron_mlp(weight.shape[1], weight.shape[0] // 2)


def modules_of(model_b, module_a: str, tensor_map) -> dict:
    """B's modules (path -> object) that the map pairs with A's module."""
    from harness.frameworks import adapter_for

    pairs = tensor_map.module_pairs([module_a])[module_a]
    return {name or ROOT: module for name, module in adapter_for("paddle").named_modules(model_b) if (name or ROOT) in pairs}


def _enclosing(module_a: str) -> list[str]:
    """The module, then (module paths nest by their dots) the ones around it, out to (root)."""
    parts = module_a.split(".") if module_a != ROOT else []
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)] + [ROOT]


def _difference(result) -> str:
    pair = result.first_difference
    if pair is None or pair.values is None:
        return ""
    stats = pair.values.stats
    return f" ({pair.name}: {stats.differing} of {stats.elements} differ, max {stats.max_ulp} ULP)"


if __name__ == "__main__":
    sys.exit(main())
