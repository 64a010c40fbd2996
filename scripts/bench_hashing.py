"""Digest throughput when a side writes its dump: MD5 (+ XXH3-128) over every tensor, in threads.

    python3 scripts/bench_hashing.py [--mib 512] [--tensors 4] [--repeat 3]

A dump-like set of --tensors tensors (bf16 and fp32, --mib MiB in all) is hashed, side by side in one run:
- "hashlib.md5, one thread": each tensor's MD5 in turn, the floor a single-threaded writer pays;
- "digests_of, 1 thread": xfalign's MD5 + XXH3-128 of every tensor without threads;
- "digests_of, threads": what Dump.write runs (one thread per core; hashlib and xxhash release the GIL);
- "digests_of (MD5 only)": what an input's digest needs (Digest.of(array, xxh3=False)): nothing checks it
  against bytes later, so no XXH3.
Throughput counts the tensors' bytes once, best of --repeat. MD5 of one tensor is one sequential stream,
so threads help across tensors: the set is split into several tensors, as a dump is.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import ml_dtypes
import numpy as np

from harness.dtypes import unsigned_view
from harness.store.digest import digests_of


def dump_like(total_mib: int, count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    each = (total_mib << 20) // count
    tensors = {}
    for index in range(count):
        dtype = ml_dtypes.bfloat16 if index % 2 == 0 else np.float32
        n = each // np.dtype(dtype).itemsize
        tensors[f"t{index}"] = rng.standard_normal(n, dtype=np.float32).astype(dtype)
    return tensors


def best_seconds(task, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        task()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--tensors", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tensors = dump_like(args.mib, args.tensors)
    gb = sum(a.nbytes for a in tensors.values()) / 1e9

    def md5_serial():
        for array in tensors.values():
            hashlib.md5(unsigned_view(array).reshape(-1).view(np.uint8)).hexdigest()

    methods = {"hashlib.md5, one thread": md5_serial,
               "digests_of (MD5 + XXH3), 1 thread": lambda: digests_of(tensors, threads=1),
               f"digests_of (MD5 + XXH3), {os.cpu_count()} threads": lambda: digests_of(tensors),
               f"digests_of (MD5 only), {os.cpu_count()} threads": lambda: digests_of(tensors, xxh3=False)}
    print(f"{args.tensors} tensors, {gb:.2f} GB, {os.cpu_count()} cores, best of {args.repeat}, "
          f"load average {os.getloadavg()[0]:.2f}")
    floor = None
    for label, task in methods.items():
        seconds = best_seconds(task, args.repeat)
        floor = floor or seconds
        print(f"{label:<40} {gb / seconds:6.2f} GB/s  ({floor / seconds:.2f}x the single-threaded MD5)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other processes share these CPUs)")


if __name__ == "__main__":
    main()
