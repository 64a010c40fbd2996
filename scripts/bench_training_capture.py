"""Capture overhead of the language-model training demo (examples/lm_training, its Megatron side: megatron-core
GPTModel without attention, torch AdamW over megatron-core's param groups, the clip restated, float32, CPU): a
step without capture and with capture(mode="digest", hash="fast", optimizer=...) and the loss and grad norm
recorded, each a run of the demo's steps, alternating, --rounds times; medians and ranges.

    python3 scripts/bench_training_capture.py [--rounds 7] [--writer thread|process] [--parts] [--floor]
        [--hidden 64 --ffn 64 --vocab 128 --layers 2 --seq 128 --batch 8]

--parts also times, in the same rounds, captures with a part of their work dropped (the writer's: no step written;
the module hooks': no activation or activation gradient recorded; both): what a part costs is the full capture's
step less that one's. A measurement aid only: those captures' trees are incomplete.

--floor also times, in the same rounds, what digesting the step's tensors costs with no bookkeeping at all: forward
hooks on every module that only hold their inputs and outputs (and gradient hooks that hold the gradients), then one
compiled digest call (harness.store.fast_hash.host_digests) over those, the parameters and their gradients as the
optimizer's step begins, and one over the parameters and the optimizer's states as it ends; each distinct tensor
once, those the compiled call reads (contiguous float32 and float64) only; nothing named, recorded or written. A
lower bound for any capture of the step on this machine, not a capture.

The demo's own sizes (the defaults) keep every float32 GEMM's inner dimension <= 192, where its bitwise Paddle
variant can follow torch's MKL kernels; --hidden 512 --ffn 1024 --vocab 4096 --seq 512 --batch 8 is a step
whose compute is large against the tensors captured.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "lm_training"))

import megatron_lm as M  # noqa: E402
import torch  # noqa: E402
from lm_setup import SIZES, batches  # noqa: E402

from harness.capture import capture  # noqa: E402
from harness.frameworks import adapter_for  # noqa: E402
from harness.store.fast_hash import host_digests  # noqa: E402

# --parts: the captures timed with a part of their work dropped, and what each drops
DROPPED = {"full": (), "no writing": ("writing",), "no module hooks": ("hooks",), "neither": ("writing", "hooks")}


def seconds_per_step(sizes, captured: bool, folder: Path, writer: str = "thread",
                     drop: tuple[str, ...] = ()) -> tuple[float, float]:
    """Seconds per step of a run of the demo's steps: the whole run (a captured one's `with` block, its entry and
    its exit, which waits for the last step's write and makes the tree durable, included), and its training loop
    alone. `drop` (--parts): "writing" skips the writer's work per step, "hooks" the module hooks' work."""
    trainer = M.Trainer(M.build_gpt(sizes))
    data = batches(sizes)
    start = time.perf_counter()
    if captured:
        with capture(trainer.model, folder, mode="digest", hash="fast", optimizer=trainer.optimizer,
                     writer=writer) as cap:
            if "writing" in drop:
                cap._write = lambda *args: None
            if "hooks" in drop:
                cap._before = cap._after = lambda *args: None
            began = time.perf_counter()
            M.train(trainer, data, on_loss=cap.loss, on_norm=cap.grad_norm)
            ended = time.perf_counter()
    else:
        began = time.perf_counter()
        M.train(trainer, data)
        ended = time.perf_counter()
    return (time.perf_counter() - start) / len(data), (ended - began) / len(data)


class Floor:
    """--floor: hooks that hold a step's tensors, digested by two compiled calls around the optimizer's step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.adapter = adapter_for("megatron")
        self.held: list[torch.Tensor] = []
        self.params = list(model.parameters())
        self.removers = [module.register_forward_hook(self._after).remove for _, module in model.named_modules()]
        self.removers += [optimizer.register_step_pre_hook(self._begins).remove,
                          optimizer.register_step_post_hook(self._ends).remove]

    def _after(self, module, args, output) -> None:
        for value in [*args, *(output if isinstance(output, tuple) else (output,))]:
            if isinstance(value, torch.Tensor):
                self.held.append(value)
                if value.requires_grad:
                    value.register_hook(self._grad)

    def _grad(self, grad: torch.Tensor) -> None:
        # a Python function: `self.held.append` itself as the hook made the demo's step ~4 ms slower (2026-12-04)
        self.held.append(grad)

    def _digest(self, tensors: list[torch.Tensor]) -> None:
        layouts, seen = [], set()
        for tensor in tensors:
            layout = self.adapter.host_layout(tensor.detach())
            if layout is not None and (layout[0], layout[2]) not in seen:
                seen.add((layout[0], layout[2]))
                layouts.append(layout)
        host_digests(layouts)

    def _begins(self, optimizer, args, kwargs) -> None:
        self._digest(self.params + [param.grad for param in self.params if param.grad is not None] + self.held)
        self.held = []

    def _ends(self, optimizer, args, kwargs) -> None:
        states = [value for param in self.params for value in optimizer.state[param].values()
                  if isinstance(value, torch.Tensor) and value.dim()]
        self._digest(self.params + states)

    def remove(self) -> None:
        for remove in self.removers:
            remove()


def floor_seconds_per_step(sizes) -> tuple[float, float]:
    """Seconds per step of a run of the demo's steps under `Floor` (the run and its loop alike)."""
    trainer = M.Trainer(M.build_gpt(sizes))
    data = batches(sizes)
    floor = Floor(trainer.model, trainer.optimizer)
    try:
        began = time.perf_counter()
        M.train(trainer, data)
        seconds = (time.perf_counter() - began) / len(data)
    finally:
        floor.remove()
    return seconds, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--writer", choices=("thread", "process"), default="thread", help="the capture's writer")
    parser.add_argument("--parts", action="store_true", help="also time captures with a part of their work dropped")
    parser.add_argument("--floor", action="store_true", help="also time the step's tensors digested with no bookkeeping")
    for field in ("hidden", "ffn", "vocab", "layers", "seq", "batch", "steps"):
        parser.add_argument(f"--{field}", type=int, default=getattr(SIZES, field))
    args = parser.parse_args()
    sizes = dataclasses.replace(SIZES, **{f: getattr(args, f) for f in ("hidden", "ffn", "vocab", "layers", "seq", "batch", "steps")})
    variants = ["no capture"] + (list(DROPPED) if args.parts else ["full"]) + (["floor"] if args.floor else [])
    times: dict[str, list[tuple[float, float]]] = {variant: [] for variant in variants}

    def run(variant: str, folder: Path) -> tuple[float, float]:
        if variant == "floor":
            return floor_seconds_per_step(sizes)
        return seconds_per_step(sizes, variant != "no capture", folder, args.writer, DROPPED.get(variant, ()))

    with M.megatron_group(), tempfile.TemporaryDirectory() as tmp:
        for variant in variants:  # warm-up
            run(variant, Path(tmp) / f"warm-{variant}")
        for round_ in range(args.rounds):
            for variant in (variants if round_ % 2 == 0 else variants[::-1]):
                times[variant].append(run(variant, Path(tmp) / f"r{round_}-{variant}"))
    print(f"demo GPTModel hidden {sizes.hidden}, ffn {sizes.ffn}, vocab {sizes.vocab}, layers {sizes.layers}, "
          f"{sizes.seq * sizes.batch} tokens, float32, {torch.get_num_threads()} torch threads; medians of {args.rounds} "
          f"runs of {sizes.steps} steps; load average {os.getloadavg()[0]:.2f}")
    for part, label in ((0, "the whole run"), (1, "its training loop alone (no capture's entry and exit)")):
        milliseconds = {variant: [t[part] * 1e3 for t in times[variant]] for variant in variants}
        plain = statistics.median(milliseconds["no capture"])
        print(f"  per step, {label}:")
        print(f"    {'no capture':<36} {spread(milliseconds['no capture'])}")
        for variant in variants[1:]:
            ratio = statistics.median(milliseconds[variant]) / plain
            name = {"full": "digest, fast, +optim., writer " + args.writer,
                    "floor": "floor: held, two digest calls"}.get(variant, f"  {variant}")
            print(f"    {name:<36} {spread(milliseconds[variant])}  x{ratio:.2f}")


def spread(milliseconds: list[float]) -> str:
    return f"{statistics.median(milliseconds):8.1f} ms  (min {min(milliseconds):.1f}, max {max(milliseconds):.1f})"


if __name__ == "__main__":
    main()
