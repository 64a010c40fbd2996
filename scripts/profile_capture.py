"""Where the time of a step captured in digest mode (hash "fast") goes on a GPU: scripts/bench_capture.py gives
the ratio to the plain step, this the split of the difference.

    python3 scripts/profile_capture.py [--model layer|moe-layer|mlp] [--hidden 4096] [--ffn 11008] [--tokens 4096]
                                       [--dtype bf16|fp32]
                                       [--rounds 5] [--steps 4] [--trace trace.json] [--writer thread|process]

Prints, medians over --rounds rounds of each variant (taking turns; a captured round is --steps steps in one
capture, as scripts/bench_capture.py times them):
- the plain step, the captured step (per step, up to the capture block's end; and its steps alone, "loop") and its
  parts on the training's thread: forward + backward (hooks and the kernels they start), `cap.step()`, the
  synchronize that waits for the device; the writer thread's time per step (fetching the digests' values, building
  and writing the dump, or handing it to the writer process: --writer), which overlaps the next step, as wall time
  and as the thread's CPU time (at most the time it held the training's GIL);
- the captured step with the digest itself replaced by a constant (hooks, bookkeeping and writing only), and
  "unwritten": digests taken and fetched, but no dump written (the writer thread's share);
- from torch.profiler over one captured step: device time of the digest kernels and of the model's kernels,
  the span the device was busy, and where in it the device sat idle (per fifth of the span; the largest gaps);
- the digest kernel alone on one large tensor: GB/s, beside torch's own sum over the same bytes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capture import forward_backward, model_and_batch, train_step  # noqa: E402

from harness.capture import api, capture  # noqa: E402
from harness.frameworks import triton_digest  # noqa: E402
from harness.frameworks.megatron_group import one_process_group  # noqa: E402
from harness.frameworks.torch import TorchAdapter  # noqa: E402
from harness.store.dump import Dump  # noqa: E402
from harness.store.fast_hash import PendingDigest  # noqa: E402

PARTS: dict[str, list[float]] = defaultdict(list)
WRITER: dict[str, list[float]] = defaultdict(list)


def constant_digest(tensor) -> PendingDigest:
    return PendingDigest("bfloat16", tuple(tensor.shape), 0, None,
                         {"dtype": "bfloat16", "shape": list(tensor.shape), "fast64": "0" * 16,
                          "stats": {"min": 0.0, "max": 0.0, "mean": 0.0, "norm": 0.0, "nan": 0, "inf": 0}})


def captured(model, x, grad, folder: Path, label: str, steps: int, constant: bool = False, write: bool = True,
             writer: str | None = None) -> None:
    """`steps` captured steps in one capture; per step: forward + backward, cap.step(), the synchronize; the
    writer thread's time per step (overlapped with the next step) and the total per step up to the block's end."""
    marks = []
    with capture(model, folder / label, mode="digest", hash="fast", writer=writer) as cap:
        if constant:
            cap.adapter = type(cap.adapter)()
            cap.adapter.device_digest = constant_digest
        if not write:  # the writer only waits for the digests' values
            cap._write = lambda step, index, pending, rows: rows and rows()
        start = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            forward_backward(model, x, grad)
            t1 = time.perf_counter()
            cap.step()
            t2 = time.perf_counter()
            if x.is_cuda:
                torch.cuda.synchronize()
            marks.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        loop = time.perf_counter() - start
    total = time.perf_counter() - start
    for part, values in zip(("fwbw", "step", "sync"), zip(*marks)):
        PARTS[f"{label}:{part}"].append(statistics.median(values))
    PARTS[f"{label}:total"].append(total / steps)
    PARTS[f"{label}:loop"].append(loop / steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "layer", "moe-layer"), default="layer")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=11008)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="steps per round of a captured variant")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--trace", help="write the profiler's chrome trace of one captured step here")
    parser.add_argument("--writer", choices=("thread", "process"), help="the capture's writer (default: capture's own)")
    args = parser.parse_args()
    torch.compiler.set_stance("force_eager")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    # the writer thread's work per step, and the transfer's start on the main thread
    for owner, name, part in ((api.Capture, "_write", "write"), (TorchAdapter, "fetch_digests", "fetch")):
        original = getattr(owner, name)

        def wrapper(*a, _original=original, _part=part, **k):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return _original(*a, **k)
            finally:  # the thread's CPU time: at most what it held the training's GIL
                WRITER[f"{_part} wall"].append(time.perf_counter() - start)
                WRITER[f"{_part} cpu"].append(time.thread_time() - cpu)

        setattr(owner, name, wrapper)

    with one_process_group(args.device), tempfile.TemporaryDirectory() as tmp:
        model, x, grad = model_and_batch(args, dtype)
        folder = Path(tmp)

        def plain() -> None:
            start = time.perf_counter()
            train_step(model, x, grad)
            PARTS["plain:total"].append(time.perf_counter() - start)

        variants = [plain, lambda: captured(model, x, grad, folder, "digest", args.steps, writer=args.writer),
                    lambda: captured(model, x, grad, folder, "constant", args.steps, constant=True, writer=args.writer),
                    lambda: captured(model, x, grad, folder, "unwritten", args.steps, write=False, writer=args.writer)]
        for variant in variants:
            variant()
        PARTS.clear()
        WRITER.clear()
        for round_ in range(args.rounds):
            turn = round_ % len(variants)
            for variant in variants[turn:] + variants[:turn]:
                variant()

        written = Dump.read(folder / "digest" / "step-00000")
        plain_ms = statistics.median(PARTS["plain:total"]) * 1e3
        print(f"{args.model}: hidden {args.hidden}, ffn {args.ffn}, tokens {args.tokens}, {args.dtype}, "
              f"{args.device}; medians of {args.rounds} rounds")
        print(f"  plain step {plain_ms:8.2f} ms")
        for label in ("digest", "constant", "unwritten"):
            total = statistics.median(PARTS[f"{label}:total"]) * 1e3
            parts = ", ".join(f"{part} {statistics.median(PARTS[f'{label}:{part}']) * 1e3:.2f}"
                              for part in ("fwbw", "step", "sync"))
            loop = statistics.median(PARTS[f"{label}:loop"]) * 1e3
            print(f"  {label:<10} {total:8.2f} ms  x{total / plain_ms:.2f}   loop {loop:.2f} ms x{loop / plain_ms:.2f}   "
                  f"({parts} ms)")
        print(f"  writer thread per step (all variants; overlaps the next step; writer {args.writer or 'default'}): " + ", ".join(
            f"{part} {statistics.median(values) * 1e3:.2f} ms" for part, values in WRITER.items()))
        sizes = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int64": 8, "int32": 4, "bool": 1}
        digested = sum(math.prod(e["shape"]) * sizes.get(e["dtype"], 4) for e in written.unstored.values())
        print(f"  {len(written.meta['capture']['records'])} records, {len(written.unstored)} tensors, "
              f"{digested / 2**30:.2f} GiB digested per step")

        # one captured step under the profiler: device time by kernel family
        from torch.profiler import ProfilerActivity, profile

        for label, run in (("plain", plain), ("digest", lambda: captured(model, x, grad, folder, "digest", 1))):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            digest = sum(e.device_time for e in kernels if e.name == "digest")
            total = sum(e.device_time for e in kernels)
            starts = [e.time_range.start for e in kernels]
            ends = [e.time_range.end for e in kernels]
            span = (max(ends) - min(starts)) if kernels else 0
            n_digest = sum(1 for e in kernels if e.name == "digest")
            print(f"  profiler {label}: {len(kernels)} kernels, device time {total / 1e3:.2f} ms "
                  f"(digest kernels {digest / 1e3:.2f} ms in {n_digest}), busy span {span / 1e3:.2f} ms")
            print_idle(sorted(kernels, key=lambda e: e.time_range.start), span)
            if label == "digest" and args.trace:
                prof.export_chrome_trace(args.trace)
            top = defaultdict(float)
            for e in kernels:
                top[e.name[:60]] += e.device_time
            for name, us in sorted(top.items(), key=lambda kv: -kv[1])[:8]:
                print(f"      {us / 1e3:7.2f} ms  {name}")

    if args.device == "cpu":
        return
    # the kernel alone on one large tensor
    for shape, dt in (((4096, 11008), torch.bfloat16), ((32, 4096, 4096), torch.bfloat16), ((4096, 4096), torch.float32)):
        tensor = torch.randn(*shape, device="cuda").to(dt)
        for name, fn in (("digest", triton_digest.fused_device_digest), ("torch sum", lambda t: t.sum(dtype=torch.float32)),
                         ("int32 sum", lambda t: t.view(torch.int32).sum())):
            fn(tensor)
            torch.cuda.synchronize()
            times = []
            for _ in range(10):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(tensor)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            seconds = statistics.median(times)
            nbytes = tensor.numel() * tensor.element_size()
            print(f"  {name:<10} {str(dt)[6:]:<9} {list(shape)!s:<18} {seconds * 1e3:7.3f} ms  {nbytes / seconds / 1e9:7.0f} GB/s")


def print_idle(kernels: list, span: float) -> None:
    """Where in the step the device sat idle: the idle time per fifth of its busy span, and the largest gaps with
    the kernels around them (a gap early in the step: the host had queued nothing yet)."""
    if len(kernels) < 2 or span <= 0:
        return
    origin = kernels[0].time_range.start
    gaps = [(b.time_range.start - a.time_range.end, a.name[:36], b.name[:36], b.time_range.start - origin)
            for a, b in zip(kernels, kernels[1:]) if b.time_range.start > a.time_range.end]
    fifths = [0.0] * 5
    for gap, _, _, at in gaps:
        fifths[min(4, int(5 * at / span))] += gap
    print(f"      idle {sum(g[0] for g in gaps) / 1e3:.2f} ms, per fifth of the span: " + " ".join(f"{f / 1e3:.2f}" for f in fifths))
    for gap, before, after, at in sorted(gaps, reverse=True)[:5]:
        print(f"      gap {gap / 1e3:6.2f} ms at {at / 1e3:6.2f} ms: {before} -> {after}")


if __name__ == "__main__":
    main()
