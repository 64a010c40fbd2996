"""Compiled (numba) kernels for a CPU tensor's fast digest (harness.store.fast_hash.fast_entry): the block sum S,
and with it the sum, sum of squares, min and max of the statistics, in one pass over the tensor's memory.

A capture in digest mode with hash="fast" hashes every CPU tensor of a step on the training thread; numpy made
several passes over each tensor, each widening it to 64 bits (~3x the time of this kernel on a 256 KiB tensor).
- S is integer arithmetic mod 2**64 (int64 multiplications wrap): equal to numpy's `block_sum_numpy` bit for bit on
  any machine (tests/test_fast_hash_host.py).
- The sums are float64 with reassociation allowed, so that they vectorize: their last bits follow the CPU's vector
  width, as the BLAS dot of numpy's path (harness.store.stats) does. Statistics are shown beside a digest and never
  compared bit for bit. min and max are exact in any order, but for the sign of a zero (`_min_max_of`).

numba is imported, and the kernels compiled, on the first use: a process that never digests a CPU tensor this way
pays nothing. numba caches them on disk beside this file, as .pyc files are (NUMBA_CACHE_DIR moves the cache; the
tests put it in a temporary folder), so a later process loads them instead of compiling (~1.4 s). Without numba `compiled()` is None and
fast_entry uses numpy.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np

# Reassociation lets the sums vectorize (their order then follows the CPU's vector width)
_REASSOCIATE = {"reassoc"}
# min and max vectorize only where NaN and the sign of zero may be ignored (see _min_max_of)
_NO_NAN = {"nnan", "nsz"}
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what block_sum_and_sums reads as it is


def _block_sum(words, weights, factors, block):  # pragma: no cover - compiled by numba (lines not traced)
    """S of int32 words (the bytes zero-padded to whole words) with W = weights, V = factors, as int64 bits."""
    total = np.int64(0)
    for b in range((words.size + block - 1) // block):
        chunk = words[b * block:(b + 1) * block]  # a slice: its indices are known in range (vectorizes)
        part = np.int64(0)
        for c in range(chunk.size):
            part += np.int64(chunk[c]) * weights[c]
        total += part * factors[b]
    return total


def _block_sum_and_sums(values, words, weights, factors, block, out):  # pragma: no cover - compiled by numba
    """`_block_sum` of `words`, and into out[0:4] the float64 sum, sum of squares, min and max of `values` (the
    same bytes as floats), a block at a time: the sums read each block while the hash's pass has it in the cache."""
    per_block = block * 4 // values.itemsize
    total = np.int64(0)
    sums = 0.0
    squares = 0.0
    low = np.inf
    high = -np.inf
    for b in range((words.size + block - 1) // block):
        chunk = words[b * block:(b + 1) * block]
        part = np.int64(0)
        for c in range(chunk.size):
            part += np.int64(chunk[c]) * weights[c]
        total += part * factors[b]
        floats = values[b * per_block:(b + 1) * per_block]
        for c in range(floats.size):
            value = np.float64(floats[c])
            sums += value
            squares += value * value
        block_low, block_high = _min_max(floats)
        low = min(low, np.float64(block_low))
        high = max(high, np.float64(block_high))
    out[0], out[1], out[2], out[3] = sums, squares, low, high
    return total


def _min_max_of(floats):  # pragma: no cover - compiled by numba, as `_min_max`
    """min and max of a non-empty block, in its own dtype. Compiled assuming no NaN (and no sign of zero), so that
    it vectorizes: where the block holds a NaN the result means nothing, and the sum, NaN too, sends the tensor's
    statistics to the careful path (harness.store.stats.stats_of_sums), which takes min and max again."""
    low = floats[0]
    high = floats[0]
    for c in range(floats.size):
        low = min(low, floats[c])
        high = max(high, floats[c])
    return low, high


_min_max: Any = None  # `_min_max_of` compiled: a global of `_block_sum_and_sums`, set before that is compiled


@functools.cache
def compiled() -> SimpleNamespace | None:
    """The kernels, compiled on the first call; None where numba is not installed."""
    try:
        import numba
    except ImportError:  # pragma: no cover - the lock installs numba; another image may not have it
        return None
    global _min_max
    for cache in (True, False):
        jit = functools.partial(numba.njit, nogil=True, boundscheck=False, cache=cache)
        try:
            _min_max = jit(fastmath=_NO_NAN)(_min_max_of)
            return SimpleNamespace(block_sum=jit()(_block_sum),
                                   block_sum_and_sums=jit(fastmath=_REASSOCIATE)(_block_sum_and_sums))
        except RuntimeError:  # no folder numba may cache in (a read-only install, no home folder): compiled each time
            continue
    return None


def block_sum_and_sums(kernels: SimpleNamespace, values: np.ndarray, weights: np.ndarray, factors: np.ndarray,
                       block: int) -> tuple[int, tuple[float, float, float, float]]:
    """(S as int64 bits, (sum, sum of squares, min, max)) of a 1-D C-contiguous fp32 or fp64 array. NaN or Inf make
    the sum non-finite."""
    out = np.empty(4)
    s = kernels.block_sum_and_sums(values, values.view(np.int32), weights, factors, block, out)
    total, squares, low, high = out.tolist()
    return int(s), (total, squares, low, high)
