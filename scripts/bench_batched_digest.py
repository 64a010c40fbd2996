"""Digests of tensors at hand together (a step's parameters, gradients, optimizer states) on a GPU: batched
(`TorchAdapter.device_digests`: the small ones read in place by one grouped launch per dtype over their addresses,
the large ones by the fused kernel, harness.frameworks.triton_batch) against one fused
launch each, taking turns: the device time of each set and the host time per tensor, medians over --rounds
rounds; each round's fast64s of both compared (any difference exits 1).

    python3 scripts/bench_batched_digest.py [--rounds 5]

Sets: a TransformerLayer's parameters (hidden 4096, ffn 11008: four weights of 32-172 MiB and four vectors,
bf16) and 40 small bf16 tensors (20 of 4,096 elements, 20 of 65,536).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_digest_kernel import taking_turns  # noqa: E402

from harness.frameworks import triton_digest  # noqa: E402
from harness.frameworks.torch import TorchAdapter, dtype_name_of  # noqa: E402
from harness.store.fast_hash import PendingDigest  # noqa: E402

SETS = {"a layer's parameters": [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (4096,), (4096,), (12288,), (22016,)],
        "40 small tensors": [(4096,)] * 20 + [(1024, 64)] * 20}


def one_set(tensors: list, batched: bool) -> tuple[float, float, list[str]]:
    """Milliseconds of device time, microseconds of host time per tensor, the fast64s."""
    adapter = TorchAdapter()
    torch.cuda.synchronize()
    torch.cuda._sleep(30_000_000)  # the device busy: the host's time is its own
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    if batched:
        pending = adapter.device_digests(tensors)
    else:
        pending = [PendingDigest(dtype_name_of(t) or "", tuple(t.shape), t.numel() * t.element_size(),
                                 triton_digest.fused_device_digest(t)) for t in tensors]
    host = (time.perf_counter() - began) * 1e6 / len(tensors)
    stop.record()
    for work, row in zip(pending, adapter.fetch_digests([p.values for p in pending])(), strict=True):
        work.settle(row)
    return start.elapsed_time(stop), host, [work.result()["fast64"] for work in pending]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not (torch.cuda.is_available() and triton_digest.importable()):
        print("needs a CUDA GPU and triton")
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; medians of {args.rounds} rounds (min-max)")
    wrong = 0
    for label, shapes in SETS.items():
        tensors = [torch.randn(shape, device="cuda").to(torch.bfloat16) for shape in shapes]
        found, differing = taking_turns(functools.partial(one_set, tensors), args.rounds)
        wrong += differing
        for batched, (device, host) in found.items():
            print(f"  {label:<22} {'batched' if batched else 'one launch each':<16} device {statistics.median(device):.3f} ms "
                  f"({min(device):.3f}-{max(device):.3f}), host {statistics.median(host):.1f} us per tensor "
                  f"({min(host):.1f}-{max(host):.1f})")
    print("fast64 batched vs one launch each: " + ("ALL EQUAL" if not wrong else f"{wrong} rounds DIFFERENT"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
