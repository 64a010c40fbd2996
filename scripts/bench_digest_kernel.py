"""The fused digest kernel (harness.frameworks.triton_digest) against torch's own read-only sum of the same tensor,
in the same run: bf16 and fp32, 64 MiB to 8 GiB. Device time only (CUDA events; the GPU first sleeps, so that the
launches queue up and their CPU time is not counted), --rounds rounds taking turns; per size the GB/s of each
and the range of the ratio over the rounds. Each tensor's fast64 is checked against the torch-ops path (up to
1 GiB) and, for the smallest size, against numpy's on the host; any difference exits 1.
With --grouped instead: steps of --count bf16 tensors of each of --grouped-sizes KiB, digested grouped (every
tensor copied into an arena, one `grouped_digest` launch at fetch_digests) and one launch each
(`fused_device_digest`), taking turns: per size the GPU time and the CPU time per tensor of each (device_digest of
each tensor and the step's fetch_digests; the GPU first sleeps, so that neither waits for it), the median and
range over the rounds; what triton_digest.GROUP_BYTES, the largest tensor grouped, is chosen from. Each step's
fast64s of both are compared.

    python3 scripts/bench_digest_kernel.py [--rounds 3] [--sizes 64 256 1024 4096 8192] [--repeat 10]
    python3 scripts/bench_digest_kernel.py --grouped [--grouped-sizes 16 64 256 1024 4096 16384] [--count 32]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import numpy as np
import torch

from harness.frameworks import triton_digest
from harness.frameworks.torch import TorchAdapter, device_digest
from harness.store.fast_hash import fast64


def device_seconds(fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / repeat


def fast64_of(tensor, kernel: str) -> str:
    os.environ["XFALIGN_FAST_DIGEST_KERNEL"] = kernel
    triton_digest.forget_route()  # read again at the next digest, not at the next step's
    try:
        pending = device_digest(tensor)
        pending.settle(TorchAdapter().fetch_digests([pending.values])()[0])
        return pending.result()["fast64"]
    finally:
        os.environ.pop("XFALIGN_FAST_DIGEST_KERNEL", None)


def grouped_step(tensors: list, grouped: bool) -> tuple[float, float, list[str]]:
    """One step of digests of `tensors`, grouped or one launch each: milliseconds of GPU time, microseconds of
    CPU per tensor (device_digest of each and fetch_digests), the fast64s."""
    os.environ["XFALIGN_DIGEST_GROUP_BYTES"] = str(1 << 40 if grouped else 0)
    triton_digest.forget_route()
    adapter = TorchAdapter()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    pending = [device_digest(tensor) for tensor in tensors]
    rows = adapter.fetch_digests([p.values for p in pending])
    cpu = (time.perf_counter() - began) * 1e6 / len(tensors)
    stop.record()
    for work, row in zip(pending, rows(), strict=True):
        work.settle(row)
    return start.elapsed_time(stop), cpu, [work.result()["fast64"] for work in pending]


def taking_turns(step, rounds: int) -> tuple[dict[bool, tuple[list[float], list[float]]], int]:
    """`step(flag)` -> (GPU time, CPU time, fast64s) for the flag True, then False, rounds + 1 times (the first a
    warm-up: compiling, the arenas' sizes): each flag's GPU and CPU times, and the rounds whose fast64s differ."""
    found: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    differing = 0
    for round_ in range(rounds + 1):
        digests = {}
        for flag in (True, False):
            gpu, cpu, digests[flag] = step(flag)
            if round_:
                found[flag][0].append(gpu)
                found[flag][1].append(cpu)
        differing += digests[True] != digests[False]
    return found, differing


def grouped_main(args) -> int:
    """--grouped: see the module's note."""
    wrong = 0
    for kib in args.grouped_sizes:
        tensors = [torch.randn(kib * 512, device="cuda").to(torch.bfloat16) for _ in range(args.count)]
        found, differing = taking_turns(functools.partial(grouped_step, tensors), args.rounds)
        wrong += differing > 0
        line = f"  {args.count} x bf16 {kib:>6} KiB:"
        for grouped, (gpu, cpu) in found.items():
            line += (f"  {'grouped' if grouped else 'one launch each'} GPU {statistics.median(gpu) * 1e3 / args.count:7.1f} us "
                     f"({min(gpu) * 1e3 / args.count:.1f}-{max(gpu) * 1e3 / args.count:.1f}), CPU {statistics.median(cpu):5.1f} us "
                     f"({min(cpu):.1f}-{max(cpu):.1f}) per tensor")
        print(line, flush=True)
        del tensors
        torch.cuda.empty_cache()
    os.environ.pop("XFALIGN_DIGEST_GROUP_BYTES", None)
    print("fast64 grouped vs one launch each: " + ("ALL EQUAL" if not wrong else f"{wrong} sizes DIFFERENT"))
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096, 8192], help="MiB")
    parser.add_argument("--grouped", action="store_true", help="grouped against one launch per tensor instead")
    parser.add_argument("--grouped-sizes", type=int, nargs="+", default=[16, 64, 256, 1024, 4096, 16384], help="KiB")
    parser.add_argument("--count", type=int, default=32, help="tensors per step (--grouped)")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and triton_digest.importable()):
        print("needs a CUDA GPU and triton")
        return 2
    import triton

    if args.grouped:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; steps of "
              f"{args.count} tensors, {args.rounds} rounds; GPU and CPU time per tensor, median (min-max over rounds)")
        return grouped_main(args)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; device time, "
          f"{args.rounds} rounds of {args.repeat} calls each; ratio = digest GB/s / torch sum GB/s (min-max over rounds)")
    wrong = 0
    for dtype in (torch.bfloat16, torch.float32):
        for mib in args.sizes:
            nbytes = mib << 20
            tensor = torch.randn(nbytes // (dtype.itemsize), device="cuda", dtype=torch.float32).to(dtype)
            found = fast64_of(tensor, "auto")
            if mib <= 1024:
                wrong += found != fast64_of(tensor, "torch")
            if mib == min(args.sizes):
                host = tensor.cpu()
                array = host.view(torch.int16).numpy() if dtype == torch.bfloat16 else host.numpy()
                if dtype == torch.bfloat16:
                    import ml_dtypes

                    array = array.view(ml_dtypes.bfloat16)
                wrong += found != fast64(np.asarray(array))
            sums, digests = [], []
            for _ in range(args.rounds):
                sums.append(device_seconds(tensor.sum, args.repeat))
                digests.append(device_seconds(functools.partial(triton_digest.fused_device_digest, tensor), args.repeat))
            ratios = [s / d for s, d in zip(sums, digests)]
            print(f"  {str(dtype)[6:]:<8} {mib:>5} MiB  torch sum {nbytes / statistics.median(sums) / 1e9:5.0f} GB/s  "
                  f"digest {nbytes / statistics.median(digests) / 1e9:5.0f} GB/s  ratio {min(ratios):.2f}-{max(ratios):.2f}",
                  flush=True)
            del tensor
            torch.cuda.empty_cache()
    resident = sorted({programs for key, programs in triton_digest._RESIDENT.items()})
    print(f"programs resident per multiprocessor (from the compiled kernels' registers): {resident}")
    print("fast64: ALL EQUAL" if not wrong else f"fast64: {wrong} DIFFERENT")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
