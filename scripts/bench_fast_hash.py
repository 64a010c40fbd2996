"""Host-side fast digest (harness.store.fast_hash, harness.store.stats): the current code against the
baseline it replaced (copied below, as it was), side by side in one run.

    python3 scripts/bench_fast_hash.py [--sizes 0.25 4 64] [--dtypes float32 bfloat16 float16 int32 int64 bool]
                                       [--repeat 7]

Per dtype and size (MiB of the tensor's bytes): GB/s of fast_entry (what a CPU capture with hash="fast" runs
in its hooks), and of its parts block_sum (the fast64 sum S) and tensor_stats, for the baseline and the
current code, and their ratio (current / baseline: above 1 is faster). The variants take turns within each
repetition (so that load from other processes hits them alike); each figure is the best of --repeat. Every
case first checks that both give the same fast64 and stats within 1e-12 relative. Last, PendingDigest.settle
(what a GPU capture runs once per tensor per step) and finish, in microseconds per call.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import time

import ml_dtypes
import numpy as np

from harness.dtypes import dtype_name, unsigned_view
from harness.store import fast_hash
from harness.store.fast_hash import BLOCK, PendingDigest, block_factors, block_sum, block_weights, fast_entry, finish, words_of
from harness.store.stats import tensor_stats

# ---- the baseline: harness.store.fast_hash and .stats before this change, verbatim but for names --------------

_MASK = (1 << 64) - 1
_OLD_CHUNK_BLOCKS = 16


def old_mix64(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def old_meta_key(dtype: str, shape: tuple[int, ...], nbytes: int) -> int:
    text = f"{dtype}|{','.join(str(int(d)) for d in shape)}|{int(nbytes)}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def old_finish(s: int, dtype: str, shape: tuple[int, ...], nbytes: int) -> str:
    value = old_mix64(np.array([(s & _MASK) ^ old_meta_key(dtype, shape, nbytes)], dtype=np.uint64))[0]
    return f"{int(value):016x}"


def old_block_sum(raw: np.ndarray) -> int:
    nbytes = raw.size
    full = nbytes // (4 * BLOCK)
    weights = block_weights()
    factors = block_factors(-(-words_of(nbytes) // BLOCK))
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, full, _OLD_CHUNK_BLOCKS):
            stop = min(full, start + _OLD_CHUNK_BLOCKS)
            words = raw[start * 4 * BLOCK: stop * 4 * BLOCK].view("<i4").astype(np.int64).view(np.uint64)
            words = words.reshape(stop - start, BLOCK)
            inner = np.einsum("ij,j->i", words, weights)
            total += np.einsum("i,i->", inner, factors[start:stop])
        tail = raw[full * 4 * BLOCK:]
        if tail.size:
            padded = np.zeros(words_of(tail.size) * 4, np.uint8)
            padded[:tail.size] = tail
            words = padded.view("<i4").astype(np.int64).view(np.uint64)
            total += np.einsum("i,i->", words, weights[:words.size]) * factors[full]
    return int(total)


def old_tensor_stats(array: np.ndarray) -> dict:
    values = array.reshape(-1)
    if values.dtype.itemsize < 4 or values.dtype.kind != "f":
        values = values.astype(np.float64 if values.dtype.itemsize > 2 else np.float32)
    nan = inf = 0
    total = float(values.sum(dtype=np.float64))
    if not np.isfinite(total):
        nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        values = values[np.isfinite(values)]
        total = float(values.sum(dtype=np.float64))
    if not values.size:
        return {"min": None, "max": None, "mean": None, "norm": None, "nan": nan, "inf": inf}
    squares = float(np.einsum("i,i->", values, values, dtype=np.float64))
    return {"min": float(values.min()), "max": float(values.max()), "mean": total / values.size,
            "norm": float(np.sqrt(squares)), "nan": nan, "inf": inf}


def old_fast_entry(array: np.ndarray) -> dict:
    raw = unsigned_view(array).reshape(-1).view(np.uint8)
    shape = tuple(int(n) for n in array.shape)
    digest = old_finish(old_block_sum(raw), dtype_name(array.dtype), shape, raw.size)
    return {"dtype": dtype_name(array.dtype), "shape": [int(n) for n in array.shape], "fast64": digest,
            "stats": old_tensor_stats(array)}


def old_settle(self: PendingDigest, row: np.ndarray) -> None:
    total, squares, low, high, elements, nan, inf = (float(v) for v in row[:7])
    s = int(np.array(row[7:8], dtype=np.float64).view(np.uint64)[0])
    count = int(elements) - int(nan) - int(inf)
    stats = {"min": None, "max": None, "mean": None, "norm": None, "nan": int(nan), "inf": int(inf)} if count == 0 \
        else {"min": low, "max": high, "mean": total / count, "norm": float(np.sqrt(squares)),
              "nan": int(nan), "inf": int(inf)}
    self.entry = {"dtype": self.dtype, "shape": list(self.shape),
                  "fast64": old_finish(s, self.dtype, self.shape, self.nbytes), "stats": stats}


# ---- the measurement -------------------------------------------------------------------------------------------

def sample(dtype: str, nbytes: int, rng: np.random.Generator) -> np.ndarray:
    """A tensor of about `nbytes` bytes, values like a training step's (normal floats, small ints, a mask)."""
    numpy_dtype = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "bool": np.dtype(np.bool_)}.get(dtype, np.dtype(dtype))
    n = max(nbytes // numpy_dtype.itemsize, 1)
    if dtype == "bool":
        return rng.random(n) < 0.5
    if numpy_dtype.kind == "i":
        return rng.integers(-50000, 50000, n).astype(numpy_dtype)
    return (rng.standard_normal(n, dtype=np.float32) * 3).astype(numpy_dtype)


def same_stats(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] if a[k] is None or b[k] is None or k in ("nan", "inf")
               else math.isclose(a[k], b[k], rel_tol=1e-12, abs_tol=1e-12) for k in a)


def best_times(tasks: dict[str, tuple], repeat: int) -> dict[str, float]:
    """Best seconds of each task, a (function, argument) pair."""
    best = dict.fromkeys(tasks, math.inf)
    names = list(tasks)
    for turn in range(repeat):
        for name in names[turn % len(names):] + names[:turn % len(names)]:  # a different one first each turn
            function, argument = tasks[name]
            start = time.perf_counter()
            function(argument)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def per_call_us(task, calls: int) -> float:
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            task()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.25, 4.0, 64.0], help="MiB per tensor")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16", "int32", "int64", "bool"])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"GB/s (tensor bytes / best of {args.repeat}); x = current / baseline")
    print(f"{'dtype':<9} {'MiB':>6} | {'fast_entry':^21} | {'block_sum':^21} | {'tensor_stats':^21}")
    print(f"{'':<9} {'':>6} | {'old':>6} {'new':>6} {'x':>6}  | {'old':>6} {'new':>6} {'x':>6}  | {'old':>6} {'new':>6} {'x':>6}")
    for dtype in args.dtypes:
        for mib in args.sizes:
            array = sample(dtype, int(mib * 2**20), rng)
            raw = unsigned_view(array).reshape(-1).view(np.uint8)
            old, new = old_fast_entry(array), fast_entry(array)
            assert old["fast64"] == new["fast64"] and old_block_sum(raw) == block_sum(raw), (dtype, mib)
            assert same_stats(old["stats"], new["stats"]), (dtype, mib, old["stats"], new["stats"])
            times = best_times({"entry old": (old_fast_entry, array), "entry new": (fast_entry, array),
                                "sum old": (old_block_sum, raw), "sum new": (block_sum, raw),
                                "stats old": (old_tensor_stats, array), "stats new": (tensor_stats, array)}, args.repeat)
            cells = []
            for part in ("entry", "sum", "stats"):
                before, after = times[f"{part} old"], times[f"{part} new"]
                cells.append(f"{array.nbytes / before / 1e9:6.2f} {array.nbytes / after / 1e9:6.2f} {before / after:5.2f}x")
            print(f"{dtype:<9} {array.nbytes / 2**20:6.2f} | " + "  | ".join(cells))
    shape, nbytes = (4096, 1024), 4096 * 1024 * 4
    row = np.array([12.5, 300.25, -3.5, 4.25, 4096 * 1024, 0, 0, 0], np.float64)
    row[7:8].view(np.uint64)[0] = 0x0123456789ABCDEF
    pending, reference = PendingDigest("float32", shape, nbytes, None), PendingDigest("float32", shape, nbytes, None)
    pending.settle(row)
    old_settle(reference, row)
    assert pending.entry == reference.entry
    fast_hash.meta_key("float32", shape, nbytes)  # what a capture's later steps find cached
    before, after = per_call_us(lambda: old_settle(reference, row), 2000), per_call_us(lambda: pending.settle(row), 2000)
    print(f"PendingDigest.settle: {before:.1f} us -> {after:.1f} us per call ({before / after:.1f}x)")
    before = per_call_us(lambda: old_finish(0x0123456789ABCDEF, "float32", shape, nbytes), 2000)
    after = per_call_us(lambda: finish(0x0123456789ABCDEF, "float32", shape, nbytes), 2000)
    print(f"finish: {before:.1f} us -> {after:.1f} us per call ({before / after:.1f}x)")


if __name__ == "__main__":
    main()
