"""Capture overhead of the language-model training demo (examples/lm_training, its Megatron side: megatron-core
GPTModel without attention, torch AdamW over megatron-core's param groups, the clip restated, float32, CPU): a
step without capture and with capture(mode="digest", hash="fast", optimizer=...) and the loss and grad norm
recorded, each a run of the demo's steps, alternating, --rounds times; medians and ranges.

    python3 scripts/bench_training_capture.py [--rounds 7] [--writer thread|process]
        [--hidden 64 --ffn 64 --vocab 128 --layers 2 --seq 128 --batch 8]

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


def seconds_per_step(sizes, captured: bool, folder: Path, writer: str = "thread") -> tuple[float, float]:
    """Seconds per step of a run of the demo's steps: the whole run (a captured one's `with` block, its entry and
    its exit, which waits for the last step's write and makes the tree durable, included), and its training loop
    alone."""
    trainer = M.Trainer(M.build_gpt(sizes))
    data = batches(sizes)
    start = time.perf_counter()
    if captured:
        with capture(trainer.model, folder, mode="digest", hash="fast", optimizer=trainer.optimizer,
                     writer=writer) as cap:
            began = time.perf_counter()
            M.train(trainer, data, on_loss=cap.loss, on_norm=cap.grad_norm)
            ended = time.perf_counter()
    else:
        began = time.perf_counter()
        M.train(trainer, data)
        ended = time.perf_counter()
    return (time.perf_counter() - start) / len(data), (ended - began) / len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--writer", choices=("thread", "process"), default="thread", help="the capture's writer")
    for field in ("hidden", "ffn", "vocab", "layers", "seq", "batch", "steps"):
        parser.add_argument(f"--{field}", type=int, default=getattr(SIZES, field))
    args = parser.parse_args()
    sizes = dataclasses.replace(SIZES, **{f: getattr(args, f) for f in ("hidden", "ffn", "vocab", "layers", "seq", "batch", "steps")})
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with M.megatron_group(), tempfile.TemporaryDirectory() as tmp:
        for captured in (False, True):  # warm-up
            seconds_per_step(sizes, captured, Path(tmp) / "warm", args.writer)
        for round_ in range(args.rounds):
            for captured in ((False, True) if round_ % 2 == 0 else (True, False)):
                times[captured].append(seconds_per_step(sizes, captured, Path(tmp) / f"r{round_}", args.writer))
    print(f"demo GPTModel hidden {sizes.hidden}, ffn {sizes.ffn}, vocab {sizes.vocab}, layers {sizes.layers}, "
          f"{sizes.seq * sizes.batch} tokens, float32, {torch.get_num_threads()} torch threads; medians of {args.rounds} "
          f"runs of {sizes.steps} steps; load average {os.getloadavg()[0]:.2f}")
    for part, label in ((0, "the whole run"), (1, "its training loop alone (no capture's entry and exit)")):
        plain, captured = ([t[part] * 1e3 for t in times[flag]] for flag in (False, True))
        ratio = statistics.median(captured) / statistics.median(plain)
        print(f"  per step, {label}:")
        print(f"    no capture             {spread(plain)}")
        print(f"    digest, fast, +optim., writer {args.writer:<7} {spread(captured)}  x{ratio:.2f}")


def spread(milliseconds: list[float]) -> str:
    return f"{statistics.median(milliseconds):8.1f} ms  (min {min(milliseconds):.1f}, max {max(milliseconds):.1f})"


if __name__ == "__main__":
    main()
