"""The training demo end to end: a megatron-core language model and its Paddle counterparts trained with AdamW on
the same batches from the same weights, each run captured by xfalign with its optimizer step, then each Paddle
run compared with the Megatron run step by step (`xfalign compare A B --map ...`).

    python3 examples/lm_training/run_lm_demo.py [--out DIR] [--variants released,matched_layers,matched_all] [--full]

Megatron side: megatron_lm.py, float32, captured as digests (hash "fast"; --full: in full). bf16 is trained too,
not captured: the Paddle side cannot run it on CPU (the demo calls the kernels Paddle lacks and prints what
Paddle says). Paddle side: paddle_lm.py, one tree per variant, captured in full (the map transposes its weights
and permutes its activations: a digest cannot follow that). Weights: drawn by megatron-core, put into Paddle's
names and layouts by the variant's map (TensorMap.to_b), bit for bit (the trees' step-0 `:param.` tensors say so).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from lm_setup import SIZES, Sizes, batches  # noqa: E402

# each Paddle variant's map: their trees differ in what has no counterpart (optimizer states, modules)
MAPS = {"released": HERE / "map_released.yaml", "matched_layers": HERE / "map_paddle_adamw.yaml",
        "matched_all": HERE / "map.yaml"}


def train_megatron(path: Path | None, sizes: Sizes = SIZES, mode: str = "digest") -> tuple[dict[str, np.ndarray], list[dict]]:
    """Train the Megatron side (float32), captured at `path` (None: not captured; digest mode: hash "fast").
    Returns its starting parameters (capture names: `<module>:param.<name>`) and its log (loss, lr, grad norm)."""
    import megatron_lm as M

    from harness.capture import capture

    with M.megatron_group():
        trainer = M.Trainer(M.build_gpt(sizes))
        start = {_param_name(name): value.copy() for name, value in M.parameters_numpy(trainer.model).items()}
        if path is None:
            return start, M.train(trainer, batches(sizes))
        with capture(trainer.model, path, mode=mode, hash="fast" if mode == "digest" else "md5", side="megatron",
                     optimizer=trainer.optimizer,
                     provenance="examples/lm_training: megatron-core GPTModel without attention, float32, torch AdamW "
                     "over megatron-core's param groups, cpu") as cap:
            log = M.train(trainer, batches(sizes), on_loss=lambda loss: _loss_and_grads(cap, loss), on_norm=cap.grad_norm)
    return start, log


def train_paddle(path: Path | None, variant: str, start: dict[str, np.ndarray], sizes: Sizes = SIZES,
                 mode: str = "full") -> list[dict]:
    """Train a Paddle variant from Megatron's starting parameters, captured at `path` (None: not captured). In
    full by default: the map transposes Paddle's weights and permutes its activations, which a digest cannot
    follow (a digest-only tensor whose layout the map changes is left out of the comparison)."""
    import paddle_lm as P

    from harness.capture import capture
    from harness.capture.mapping import load_map

    model = P.build_model(variant, sizes)
    P.load_parameters(model, paddle_weights(start, load_map(MAPS[variant])))
    optimizer = P.build_optimizer(model)
    if path is None:
        return P.train(model, optimizer, batches(sizes))
    with capture(model, path, mode=mode, hash="fast" if mode == "digest" else "md5", side=f"paddle-{variant}",
                 optimizer=optimizer,
                 provenance=f"examples/lm_training: Paddle variant {variant}, float32, cpu") as cap:
        if isinstance(optimizer._grad_clip, P.MegatronClip):
            optimizer._grad_clip.on_norm = cap.grad_norm  # Megatron's reported norm, as its step returns it
        return P.train(model, optimizer, batches(sizes), on_loss=lambda loss: _loss_and_grads(cap, loss))


def _param_name(name: str) -> str:
    module, slot = name.rsplit(".", 1)
    return f"{module}:param.{slot}"


def _loss_and_grads(cap, loss) -> None:
    """After the backward pass: the loss, and the gradients as the backward pass left them (before clipping)."""
    cap.loss(loss)
    cap.step()


def paddle_weights(start: dict[str, np.ndarray], tensor_map) -> dict[str, np.ndarray]:
    """Megatron's `<module>:param.<name>` arrays in Paddle's parameter names and layouts, through the map."""
    from harness.store.tree_format import TensorName

    weights = {}
    for name, array in tensor_map.to_b(start).items():
        parsed = TensorName.parse(name)
        weights[f"{parsed.module}.{parsed.slot}"] = array
    return weights


def compare(tree_a: Path, tree_b: Path, map_path: Path) -> tuple[int, str]:
    """`xfalign compare A B --map M` (its JSON and HTML reports beside B): its exit code and what it prints."""
    from harness.cli import main as xfalign

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = xfalign(["compare", str(tree_a), str(tree_b), "--map", str(map_path),
                        "--json", str(tree_b.parent / f"{tree_b.name}.json"),
                        "--html", str(tree_b.parent / f"{tree_b.name}.html")])
    return code, out.getvalue()


def bf16_report(sizes: Sizes = SIZES) -> list[str]:
    """bf16: the Megatron side trained (losses), the Paddle side's first kernel that is missing on CPU."""
    import megatron_lm as M
    import paddle
    import torch

    with M.megatron_group():
        log = M.train(M.Trainer(M.build_gpt(sizes, dtype=torch.bfloat16)), batches(sizes))
    lines = ["megatron bf16 (Float16Module, fp32 main params): losses " + " ".join(f"{step['loss']:.4f}" for step in log)]
    paddle.set_device("cpu")
    layer = paddle.nn.Linear(sizes.hidden, sizes.hidden)
    layer.to(dtype="bfloat16")
    optimizer = paddle.optimizer.AdamW(parameters=layer.parameters(), multi_precision=True)
    for what, run in (("paddle.nn.Linear forward", lambda: layer(paddle.ones([2, sizes.hidden], dtype="bfloat16"))),
                      ("paddle.optimizer.AdamW step (multi_precision)",
                       lambda: (layer.weight.cast("float32").sum().backward(), optimizer.step()))):
        try:
            run()
            lines.append(f"paddle bf16 {what}: runs")
        except RuntimeError as error:
            lines.append(f"paddle bf16 {what}: N/A, {str(error).strip().splitlines()[0]}")
    return lines


def _megabytes(folder: Path) -> str:
    return f"{sum(f.stat().st_size for f in folder.rglob('*') if f.is_file()) / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder for the trees (default: a temporary one)")
    parser.add_argument("--variants", default=",".join(MAPS), help="Paddle variants, comma-separated")
    parser.add_argument("--full", action="store_true",
                        help="capture the Megatron side in full too (values, ULPs), not as digests")
    parser.add_argument("--init-std", type=float, default=SIZES.init_std,
                        help=f"megatron-core's init_method_std (default {SIZES.init_std}: the clip acts in steps 0-2; "
                        "0.02, megatron-core's default: it never acts)")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 part")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="xfalign-lm-training-"))
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(MAPS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(MAPS)}")

    sizes = dataclasses.replace(SIZES, init_std=args.init_std)
    tree_a = out / "megatron"
    began = time.perf_counter()
    start, log = train_megatron(tree_a, sizes, mode="full" if args.full else "digest")
    print(f"megatron fp32: {len(log)} steps captured in {time.perf_counter() - began:.1f} s, tree {_megabytes(tree_a)}; "
          "losses " + " ".join(f"{step['loss']:.6f}" for step in log))
    code = 0
    for variant in variants:
        tree_b = out / f"paddle-{variant}"
        began = time.perf_counter()
        train_paddle(tree_b, variant, start, sizes)
        print(f"paddle {variant}: captured in {time.perf_counter() - began:.1f} s, tree {_megabytes(tree_b)}")
        print(f"\n=== megatron vs paddle {variant}: xfalign compare {tree_a} {tree_b} --map {MAPS[variant].name}")
        result, text = compare(tree_a, tree_b, MAPS[variant])
        print(text, end="")
        code = max(code, result if result != 1 else 0)  # 1: the trees differ, what the demo shows
    if not args.no_bf16:
        print("\n" + "\n".join(bf16_report(sizes)))
    print(f"\ntrees in {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
