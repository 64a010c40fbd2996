"""Comparator throughput and peak memory, side by side with numpy's and torch's equality asserts.

    python3 scripts/bench_comparator.py [--mib 256] [--repeat 3]

Each pair is two tensors of --mib MiB (shape [-1, 4096]). "xfalign compare" is what `xfalign compare`
does per tensor once a dump's file is loaded (harness.compare.case.compare_dumps on dumps read with
check_bytes=False): harness.compare.pairs.originate with a digest check of each side
(harness.store.digest.StreamCheck, the MD5 and XXH3-128 recorded when the dump was written), in one
chunked, threaded pass over the data: the digest checks, bitwise and canonical equality, differing /
signed-zero / NaN / Inf counts, ULP max + index + histogram, max abs and rel error, worst elements and
the mismatch heatmap grid; then the checks' verdicts. The others: np.array_equal on integer views of the bits,
numpy.testing.assert_array_max_ulp (no bf16) and torch.testing.assert_close(rtol=0, atol=0).

Throughput counts the bytes of both tensors, best of --repeat (assert_array_max_ulp: one run). Every
measurement runs in a process forked for it (torch's thread pool does not survive a fork, and the peak
memory of one method must not hide in memory another left behind); peak memory is the rise of the
resident set (VmHWM - VmRSS before) while the method runs, relative to the bytes of the pair.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import ml_dtypes
import numpy as np
from numpy.testing import assert_array_max_ulp

from harness.compare.pairs import originate
from harness.store.digest import StreamCheck, digests_of

PAIRS = [("fp32, 0.01% differ by 1-3 ULP", np.float32, 1e-4),
         ("fp32, 1% differ by 1-3 ULP", np.float32, 1e-2),
         ("bf16, 0.01% differ by 1-3 ULP", ml_dtypes.bfloat16, 1e-4),
         ("bf16, 1% differ by 1-3 ULP", ml_dtypes.bfloat16, 1e-2),
         ("fp32, all differ by 1-3 ULP", np.float32, 1.0),
         ("bf16, all differ by 1-3 ULP", ml_dtypes.bfloat16, 1.0)]
METHODS = ("xfalign compare", "np.array_equal", "assert_array_max_ulp", "torch assert_close")


def make_pair(dtype, nbytes: int, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    n = nbytes // np.dtype(dtype).itemsize
    a = rng.standard_normal(n, dtype=np.float32).astype(dtype)
    b = a.copy()
    raw = b.view(np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32)
    where = rng.choice(n, int(n * fraction), replace=False) if fraction < 1 else slice(None)
    raw[where] += rng.integers(1, 4, raw[where].size).astype(raw.dtype)
    return a, b


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key))


def _forked(task) -> dict:
    """task() in a forked child: its result, as JSON through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = task()
        except BaseException as error:  # noqa: BLE001 - reported by the parent
            result = {"error": f"{type(error).__name__}: {error}"}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _measure(run, repeat: int) -> dict:
    before = _status_kib("VmRSS:")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"seconds": min(times), "peak_bytes": max(0, _status_kib("VmHWM:") - before) * 1024}


def _method(name: str, a: np.ndarray, b: np.ndarray, digests: dict):
    """The call to time, or None where the method does not take the dtype."""
    if name == "xfalign compare":
        def run():
            checks = (StreamCheck(a, digests["a"]), StreamCheck(b, digests["b"]))
            originate("t", a, b, (digests["a"], digests["b"]), checks)  # stats, heatmap, digests: one pass
            assert all(check.matches() for check in checks)
        return run
    if name == "np.array_equal":
        uint = np.uint16 if a.itemsize == 2 else np.uint32
        return lambda: np.array_equal(a.view(uint), b.view(uint))
    if name == "assert_array_max_ulp":
        if a.dtype != np.float32:
            return None  # numpy's ULP functions do not take bf16
        return lambda: assert_array_max_ulp(a, b, maxulp=10)
    import torch  # imported in the child only

    def as_torch(x: np.ndarray):
        if x.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(x)

    ta, tb = as_torch(a), as_torch(b)

    def run():
        try:
            torch.testing.assert_close(ta, tb, rtol=0, atol=0)
        except AssertionError:
            pass  # it differs: the report (and the time to make it) is part of the call
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="MiB per tensor")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    nbytes = args.mib << 20
    load = os.getloadavg()[0]
    print(f"2 x {args.mib} MiB per pair, shape [-1, 4096]; {os.cpu_count()} CPUs, load average {load:.2f} at start; "
          f"best of {args.repeat} (assert_array_max_ulp: 1 run)")
    print("xfalign compare = originate with the MD5 + XXH3 checks of both arrays against their recorded digests "
          "(all metrics, the heatmap and the digest checks in one pass)")
    rows = []
    for label, dtype, fraction in PAIRS:
        a, b = make_pair(dtype, nbytes, fraction, rng)
        a, b = a.reshape(-1, 4096), b.reshape(-1, 4096)
        digests = digests_of({"a": a, "b": b})  # recorded when the dumps are written; not timed
        results = {}
        for name in METHODS:
            run = _method(name, a, b, digests)
            repeat = 1 if name == "assert_array_max_ulp" else args.repeat
            results[name] = None if run is None else _forked(lambda run=run, repeat=repeat: _measure(run, repeat))
        rows.append((label, a.nbytes + b.nbytes, results))
        del a, b
    print()
    print("Throughput, GB/s over both tensors (higher is better)")
    print(f"{'pair':32s}" + "".join(f"{name:>22s}" for name in METHODS))
    for label, total, results in rows:
        cells = [_cell(r, lambda r, total=total: f"{total / r['seconds'] / 1e9:.2f}") for r in results.values()]
        print(f"{label:32s}" + "".join(f"{c:>22s}" for c in cells))
    print()
    print(f"Peak memory while running: resident-set rise, MiB (% of the pair's {2 * args.mib} MiB)")
    print(f"{'pair':32s}" + "".join(f"{name:>22s}" for name in METHODS))
    for label, total, results in rows:
        cells = [_cell(r, lambda r, total=total: f"{r['peak_bytes'] / 2**20:.0f} ({100 * r['peak_bytes'] / total:.0f}%)")
                 for r in results.values()]
        print(f"{label:32s}" + "".join(f"{c:>22s}" for c in cells))
    worst = max(((total + r["peak_bytes"]) / total, label) for label, total, results in rows
                for r in [results["xfalign compare"]] if r is not None and "error" not in r)
    print(f"xfalign compare: pair + rise at most {worst[0]:.2f}x the pair ({worst[1]}); the bound is 3x")
    for label, _, results in rows:
        for name, result in results.items():
            if result is not None and "error" in result:
                print(f"{label}, {name}: {result['error']}")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end (other processes share these CPUs)")


def _cell(result: dict | None, text) -> str:
    if result is None:
        return "n/a"
    if "error" in result:
        return "error"
    return text(result)


if __name__ == "__main__":
    main()
