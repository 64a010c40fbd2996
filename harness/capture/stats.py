"""What a capture records of one tensor: its digests (MD5 + XXH3-128 of the raw bytes) and statistics."""

from __future__ import annotations

import numpy as np

from harness.digest import digests_of


def tensor_stats(array: np.ndarray) -> dict:
    """min, max, mean and L2 norm over the finite values, in float64 (None when there are none), and
    the NaN and Inf counts (harness.capture.format.TensorStats fields)."""
    values = array.reshape(-1)
    if values.dtype.itemsize < 4 or values.dtype.kind != "f":  # bf16, fp16, ints, bool: exact in float64,
        values = values.astype(np.float64 if values.dtype.itemsize > 2 else np.float32)  # fp32 if they fit
    nan = inf = 0
    total = float(values.sum(dtype=np.float64))
    if not np.isfinite(total):  # rare: only then pay for the masks (a float64 sum of fp32 cannot overflow)
        nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
        values = values[np.isfinite(values)]
        total = float(values.sum(dtype=np.float64))
    if not values.size:
        return {"min": None, "max": None, "mean": None, "norm": None, "nan": nan, "inf": inf}
    # einsum, not np.dot: BLAS threads would fight the training step's threads for the cores
    squares = float(np.einsum("i,i->", values, values, dtype=np.float64))
    # min and max are exact in the array's own (float) type
    return {"min": float(values.min()), "max": float(values.max()), "mean": total / values.size,
            "norm": float(np.sqrt(squares)), "nan": nan, "inf": inf}


def digest_entry(array: np.ndarray) -> dict:
    """An unstored tensor's entry of a dump (Dump.unstored): dtype, shape, MD5, XXH3 and stats."""
    digest = digests_of({"": array}, threads=1)[""]  # one thread: this already runs on the capture's pool
    return {**digest.to_json(xxh3=True), "stats": tensor_stats(array)}
