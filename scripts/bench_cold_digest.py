"""A digest call's host time in a tight loop and with other work between calls (CUDA only): what makes a capture
hook's digest cost several times in a training step what it costs in scripts/check_fast_digest.py's loops.

    python3 scripts/bench_cold_digest.py

Per way and path, the median of its calls over 40 steps (the first 20 calls left out), their 10th and 90th percentiles, three
repetitions taking turns: `device_digest` of six bf16 tensors of 32 MiB (the fused path, a launch each) and of four
of 4 MiB (copied into the grouped arena), called back to back ("tight"), with a sum over 16 MiB of host memory
between calls ("memory"), with 3,000 small Python objects made between calls ("python"), and with a 12-layer torch
MLP's forward (8 x 64) between calls ("torch ops"). Only the digest call is timed; each step's digests are fetched
after its calls. docs/capture-guide.md gives its figures (the small MLP's training thread, call by call).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from harness.frameworks.torch import TorchAdapter, device_digest


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_cold_digest: needs a CUDA GPU")
    big = [torch.randn(2048, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(6)]
    small = [torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    junk = np.random.rand(2 << 20)  # 16 MiB
    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)]).cuda()
    batch = torch.randn(8, 64, device="cuda")

    def memory() -> None:
        junk.sum()

    def python() -> None:
        made = {}
        for i in range(3000):
            made[str(i)] = (i, [i])

    def torch_ops() -> None:
        with torch.no_grad():
            layers(batch)

    ways = {"tight": None, "memory": memory, "python": python, "torch ops": torch_ops}
    adapter = TorchAdapter()
    for repetition in range(3):
        for name, between in ways.items():
            for path, tensors in (("fused", big), ("grouped", small)):
                times = []
                for _ in range(40):
                    pending = []
                    for tensor in tensors:
                        if between is not None:
                            between()
                        start = time.perf_counter()
                        pending.append(device_digest(tensor))
                        times.append(time.perf_counter() - start)
                    adapter.fetch_digests([work.values for work in pending])()
                kept = times[20:]
                print(f"rep {repetition} {name:10s} {path:8s} median {statistics.median(kept) * 1e6:6.1f} us "
                      f"(p10 {np.percentile(kept, 10) * 1e6:6.1f}, p90 {np.percentile(kept, 90) * 1e6:6.1f})", flush=True)


if __name__ == "__main__":
    main()
