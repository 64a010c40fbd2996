"""Comparator throughput on 2 x 256 MiB tensors, side by side with numpy's ULP assert and array_equal.

    python3 scripts/bench_comparator.py [--mib 256] [--repeat 3]

Throughput counts the bytes of both tensors. "full comparison" is harness.metrics.element_stats:
bitwise and canonical equality, differing / signed-zero / NaN / Inf counts, ULP max + index +
histogram, max abs and rel error, worst elements. (MD5 digests are taken once, when a side writes its
dump, not per comparison.)
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np
from numpy.testing import assert_array_max_ulp

from harness.metrics import element_stats


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def make_pair(dtype, nbytes: int, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    n = nbytes // np.dtype(dtype).itemsize
    a = rng.standard_normal(n, dtype=np.float32).astype(dtype)
    b = a.copy()
    raw = b.view(np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32)
    where = rng.choice(n, int(n * fraction), replace=False) if fraction < 1 else slice(None)
    raw[where] += rng.integers(1, 4, raw[where].size).astype(raw.dtype)
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    nbytes = args.mib << 20
    print(f"2 x {args.mib} MiB per pair; best of {args.repeat}; GB/s over both tensors")
    print(f"{'pair':42s} {'full comparison':>16s} {'np.array_equal':>15s} {'assert_max_ulp':>15s} {'vs max_ulp':>11s} {'vs equal':>9s}")
    for label, dtype, fraction in [("fp32, 0.01% differ by 1-3 ULP", np.float32, 1e-4),
                                   ("fp32, 1% differ by 1-3 ULP", np.float32, 1e-2),
                                   ("bf16, 1% differ by 1-3 ULP", ml_dtypes.bfloat16, 1e-2),
                                   ("fp32, all differ by 1-3 ULP", np.float32, 1.0)]:
        print(measure(label, *make_pair(dtype, nbytes, fraction, rng), args.repeat))


def measure(label: str, a: np.ndarray, b: np.ndarray, repeat: int) -> str:
    total = a.nbytes + b.nbytes
    uint = np.uint16 if a.itemsize == 2 else np.uint32
    t_full = best_time(lambda: element_stats(a, b), repeat)
    t_equal = best_time(lambda: np.array_equal(a.view(uint), b.view(uint)), repeat)
    if a.dtype == np.float32:
        t_ulp = best_time(lambda: assert_array_max_ulp(a, b, maxulp=10), 1)
        ulp_text, ratio = f"{total / t_ulp / 1e9:12.2f}", f"{t_ulp / t_full:9.1f}x"
    else:  # numpy's ULP functions do not take bf16
        ulp_text, ratio = f"{'n/a':>12s}", f"{'-':>10s}"
    return (f"{label:42s} {total / t_full / 1e9:13.2f}    {total / t_equal / 1e9:12.2f}   {ulp_text}   {ratio} "
            f"{t_full / t_equal:7.1f}x slower")

if __name__ == "__main__":
    main()
