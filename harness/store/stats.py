"""The statistics of one tensor a capture records (its digests: harness.store.digest.digest_entry)."""

from __future__ import annotations

import math
import threading

import ml_dtypes
import numpy as np

# The statistics run over the tensor a chunk at a time, each chunk widened to float64 into one buffer reused
# for all (a whole-tensor float64 copy costs page faults and falls out of the cache); the sum and the sum of
# squares are taken from that widened chunk, min and max from the narrower one (fewer bytes to read).
# (A capture's fast digest of an fp32 or fp64 tensor takes them from a compiled kernel: harness.store.cpu_kernels.)
# Squares are summed by BLAS dot products of _ROW values each: OpenBLAS computes a dot that short on the calling
# thread (it spreads only long ones over its threads, which would fight the training step's for the cores),
# and ~3x faster than einsum. Every value is >= 0, so any order of that sum is as good.
_ROW = 8192
_CHUNK = 32 * _ROW  # values per chunk (2 MiB of float64): smaller chunks pay more in numpy calls than they win in cache
_BF16, _FP16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
_FP16_SCALE = np.float32(2.0 ** 112)  # 2 ** (fp32's exponent bias 127 - fp16's 15)
_FP16_MAX = 65504.0  # fp16's largest finite value
_SUBNORMAL = np.float32(2.0 ** -140)
_SCRATCH = threading.local()


def scratch(key: str, count: int, dtype: type) -> np.ndarray:
    """`count` values of `dtype`, in a buffer this thread keeps for its next call with the same key: a fresh
    temporary of a few MiB each call costs its page faults (the kernel zeroes every page), about as much as the
    work done in it. Each caller uses its own key, and none holds the buffer past its return."""
    buffer = getattr(_SCRATCH, key, None)
    if buffer is None or buffer.size < count:
        buffer = np.empty(count, dtype)
        setattr(_SCRATCH, key, buffer)
    return buffer[:count]


def _fp16_to_fp32(chunk: np.ndarray, out: np.ndarray) -> None:
    """fp16 -> fp32, exact, ~3x numpy's cast (which converts one value at a time): the sign to bit 31, the
    exponent and mantissa bits to fp32's place, then * 2**112 rebiases the exponent (and makes fp16's subnormals,
    which land as fp32 subnormals, right). Inf and NaN come out finite, with magnitude >= 65536."""
    if _SUBNORMAL * _FP16_SCALE == 0:  # subnormals read as zero on this thread (DAZ): numpy's own cast then
        np.copyto(out, chunk)
        return
    bits = out.view(np.int32)
    np.copyto(bits, chunk.view(np.int16))  # sign-extended: the sign lands in bit 31, and in bits 28-30 ...
    bits <<= 13
    np.bitwise_and(bits, np.int32(-0x70000001), out=bits)  # ... which this clears (the mask is 0x8FFFFFFF)
    out *= _FP16_SCALE


def _sum_of_squares(values: np.ndarray) -> float:
    """The sum of squares of a 1-D float64 array, by BLAS dot products of at most _ROW values each."""
    whole = values.size - values.size % _ROW
    rows, rest = values[:whole].reshape(-1, _ROW), values[whole:]
    squares = float(np.dot(rest, rest)) if rest.size else 0.0
    if whole:  # a dot per row (numpy 2's np.vecdot does the same)
        squares += float(np.matmul(rows[:, None, :], rows[:, :, None]).sum())
    return squares


def tensor_stats(array: np.ndarray) -> dict:
    """min, max, mean and L2 norm over the finite values, in float64 (None when there are none), and
    the NaN and Inf counts (harness.store.tree_format.TensorStats fields)."""
    values = array.reshape(-1)
    n = values.size
    if not n:
        return {"min": None, "max": None, "mean": None, "norm": None, "nan": 0, "inf": 0}
    if values.dtype == np.bool_:  # 0s and 1s: the count of 1s is both the sum and the sum of squares
        ones = int(np.count_nonzero(values))
        return {"min": float(ones == n), "max": float(ones > 0), "mean": ones / n, "norm": math.sqrt(ones), "nan": 0, "inf": 0}
    # bf16 and fp16 are widened to fp32 first: min and max on fp32 are ~2x faster than on float64, and far
    # faster than on the 2-byte types themselves. Every other supported type is widened straight to float64
    # (exactly, but for int64 beyond 2**53) and its min and max taken in its own type (exact, and fast).
    narrow = scratch("stats_fp32", min(n, _CHUNK), np.float32) if values.dtype in (_BF16, _FP16) else None
    wide = scratch("stats_fp64", min(n, _CHUNK), np.float64)
    total = squares = 0.0
    low, high = math.inf, -math.inf
    with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are taken care of by stats_of_sums
        for start in range(0, n, _CHUNK):
            chunk = values[start:start + _CHUNK]
            if narrow is not None:
                if values.dtype == _FP16:
                    _fp16_to_fp32(chunk, narrow[:chunk.size])
                else:
                    np.copyto(narrow[:chunk.size], chunk)
                chunk = narrow[:chunk.size]
            part = wide[:chunk.size]
            np.copyto(part, chunk)
            total += float(part.sum())  # pairwise within the chunk
            squares += _sum_of_squares(part)
            low, high = min(low, float(chunk.min())), max(high, float(chunk.max()))
    return stats_of_sums(values, (total, squares, low, high))


def stats_of_sums(values: np.ndarray, sums: tuple[float, float, float, float]) -> dict:
    """tensor_stats of a 1-D array from its float64 (sum, sum of squares, min, max)."""
    total, squares, low, high = sums
    # NaN or Inf make the sum non-finite (fp16's came out of _fp16_to_fp32 as large finite values, hence the
    # second test): rare, and only then pay for the masks. A float64 sum of the narrower types cannot overflow;
    # where a float64 tensor's does, the masks find nothing and the mean stays Inf, as it was.
    if not math.isfinite(total) or (values.dtype == _FP16 and max(-low, high) > _FP16_MAX):
        return _stats_of_finite(values)
    return {"min": low, "max": high, "mean": total / values.size, "norm": math.sqrt(squares), "nan": 0, "inf": 0}


def _stats_of_finite(values: np.ndarray) -> dict:
    """tensor_stats of a 1-D array that holds NaN or Inf (or whose float64 sum overflows): with masks."""
    if values.dtype.itemsize < 4 or values.dtype.kind != "f":  # bf16, fp16, ints, bool: exact in float64,
        values = values.astype(np.float64 if values.dtype.itemsize > 2 else np.float32)  # fp32 if they fit
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    values = values[np.isfinite(values)]
    if not values.size:
        return {"min": None, "max": None, "mean": None, "norm": None, "nan": nan, "inf": inf}
    total = float(values.sum(dtype=np.float64))
    # einsum, not np.dot: a long BLAS dot would run on BLAS threads (see _ROW); this path is rare, so kept simple
    squares = float(np.einsum("i,i->", values, values, dtype=np.float64))
    return {"min": float(values.min()), "max": float(values.max()), "mean": total / values.size,
            "norm": float(np.sqrt(squares)), "nan": nan, "inf": inf}

