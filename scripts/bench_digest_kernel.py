"""The fused digest kernel (harness.frameworks.triton_digest) against torch's own read-only sum of the same tensor,
in the same run: bf16 and fp32, 64 MiB to 8 GiB. Device time only (CUDA events; the GPU first sleeps, so that the
launches queue up and their CPU time is not counted), --rounds rounds taking turns; per size the GB/s of each
and the range of the ratio over the rounds. Each tensor's fast64 is checked against the torch-ops path (up to
1 GiB) and, for the smallest size, against numpy's on the host; any difference exits 1.

    python3 scripts/bench_digest_kernel.py [--rounds 3] [--sizes 64 256 1024 4096 8192] [--repeat 10]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

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
    try:
        pending = device_digest(tensor)
        pending.settle(TorchAdapter().fetch_digests([pending.values])()[0])
        return pending.result()["fast64"]
    finally:
        os.environ.pop("XFALIGN_FAST_DIGEST_KERNEL", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096, 8192], help="MiB")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and triton_digest.importable()):
        print("needs a CUDA GPU and triton")
        return 2
    import triton

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
