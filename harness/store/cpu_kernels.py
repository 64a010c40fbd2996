"""Compiled (numba) kernels for a CPU tensor's fast digest (harness.store.fast_hash.fast_entry): the block sum S,
and with it the sum, sum of squares, min and max of the statistics, in one pass over the tensor's memory.

A capture in digest mode with hash="fast" hashes every CPU tensor of a step on the training thread; numpy made
several passes over each tensor, each widening it to 64 bits (~3x the time of this kernel on a 256 KiB tensor).
- S is integer arithmetic mod 2**64 (int64 multiplications wrap): equal to numpy's `block_sum_numpy` bit for bit on
  any machine (tests/test_fast_hash_host.py).
- The sums are float64 with reassociation allowed, so that they vectorize: their last bits follow the CPU's vector
  width, as the BLAS dot of numpy's path (harness.store.stats) does. Statistics are shown beside a digest and never
  compared bit for bit.
- min and max are exact: taken over the floats' bits as ordered integers (`_ordered`), which vectorize where
  numba's float min and max did not (~10x slower: 34 vs 3.4 us per 64 Ki fp32 on this project's CI machine).

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
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what block_sum_and_sums reads as it is
# a float's bits as the signed integers `_ordered` reads: their dtype, shift to the sign bit, magnitude bits
_ORDERED: dict[int, tuple[np.dtype, np.signedinteger, np.signedinteger]] = {
    4: (np.dtype(np.int32), np.int32(31), np.int32(0x7FFFFFFF)),
    8: (np.dtype(np.int64), np.int64(63), np.int64(0x7FFFFFFFFFFFFFFF))}


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


def _block_sum_and_sums(values, bits, shift, magnitude, words, weights, factors, block, out, extremes):  # pragma: no cover
    """`_block_sum` of `words`, into out[0:2] the float64 sum and sum of squares of `values` (the same bytes as
    floats), and into extremes[0:2] the bits of their min and max (`bits`: the floats' bits as signed integers of
    their width; `shift`, `magnitude`: that width less one, and its magnitude bits), in one pass over the tensor's
    blocks. float32: one loop, a float being one word of the hash, read once, its min and max key kept in 32 bits
    (`_ordered32`); float64 (two words each): a loop each over a block, which vectorize at their own widths.
    Against one loop for both widths with 64-bit keys (2026-12-04, numba 0.68.1, six runs here and one there of 3 x
    300 calls, each figure the mean of 300): on a 2-core AMD EPYC with AVX2 (no 64-bit vector multiply), 4 MiB of
    float32 in 502-563 against 613-732 us, 512 KiB of float64 in 52-63 against 72-85, 256 KiB of float32 in 32-44
    against 38-45 (in four runs of six about 33 against 40, in two even); on the H200 machine's Intel Xeon (AVX-512)
    float32 about even (256 KiB 30.5-31.1 against 28.2-31.5 us, 4 MiB 508-605 against 478-578), float64 49.1-51.1
    against 68.1-69.3 us. Compiled by numba (lines not traced); the branch on the width is folded at compile time."""
    wide = values.itemsize == 8
    per_block = block * 4 // values.itemsize
    total = np.int64(0)
    sums = 0.0
    squares = 0.0
    low = high = _ordered(bits[0], shift, magnitude)
    low32, high32 = np.int32(low), np.int32(high)  # float32's
    for b in range((values.size + per_block - 1) // per_block):
        chunk = words[b * block:(b + 1) * block]  # slices: their indices are known in range (vectorizes)
        floats = values[b * per_block:(b + 1) * per_block]
        part = np.int64(0)
        if wide:
            for c in range(chunk.size):
                part += np.int64(chunk[c]) * weights[c]
            for c in range(floats.size):
                value = np.float64(floats[c])
                sums += value
                squares += value * value
            keys = bits[b * per_block:(b + 1) * per_block]
            for c in range(keys.size):
                key = _ordered(keys[c], shift, magnitude)
                low = min(low, key)
                high = max(high, key)
        else:
            for c in range(floats.size):
                word = chunk[c]
                part += np.int64(word) * weights[c]
                key32 = _ordered32(word)
                low32 = min(low32, key32)
                high32 = max(high32, key32)
                value = np.float64(floats[c])
                sums += value
                squares += value * value
        total += part * factors[b]
    if not wide:
        low, high = low32, high32
    out[0], out[1] = sums, squares
    # the map from bits to ordered keys is its own inverse
    extremes[0], extremes[1] = _ordered(low, shift, magnitude), _ordered(high, shift, magnitude)
    return total


def _ordered_of(bits, shift, magnitude):  # pragma: no cover - compiled by numba, as `_ordered`
    """A float's bits (a signed integer) as an integer in the floats' order: a negative float's magnitude bits
    flipped. -0 comes before +0; NaNs lie beyond the infinities (where one is, the sum is NaN and the statistics take
    the careful path: harness.store.stats.stats_of_sums). The map is its own inverse."""
    return bits ^ ((bits >> shift) & magnitude)


def _ordered32_of(bits):  # pragma: no cover - compiled by numba, as `_ordered32`
    """`_ordered` of a float32's bits kept in 32 bits (numba widens int32 arithmetic to 64 bits: half the lanes)."""
    return np.int32(bits ^ np.int32((bits >> np.int32(31)) & np.int32(0x7FFFFFFF)))


def _batch_sums(addresses, counts, wide, weights, factors, block, rows, s_bits):  # pragma: no cover - compiled
    """`_block_sum_and_sums` of many C-contiguous float32 or float64 tensors at their addresses (`wide`: float64),
    in one call: a step's parameters, gradients and optimizer states cost one call instead of one each (its
    arguments' typing, the wrapper's Python). Into row i of `rows` the SLOTS of fast_hash (sum, sum of squares, min,
    max, elements, then 0 NaN and 0 Inf: the sum is non-finite where either is, and the caller redoes that tensor
    alone), S into s_bits[i]."""
    out = np.empty(2)
    narrow = np.empty(2, np.float32)
    double = np.empty(2)
    for i in range(addresses.size):
        n = counts[i]
        if wide[i]:
            values = _carray(_float64_at(addresses[i]), n)
            bits = _carray(_int64_at(addresses[i]), n)
            words = _carray(_int32_at(addresses[i]), 2 * n)
            s = _block_sum_and_sums_c(values, bits, np.int64(63), np.int64(0x7FFFFFFFFFFFFFFF), words, weights,
                                      factors, block, out, double.view(np.int64))
            low, high = double[0], double[1]
        else:
            values32 = _carray(_float32_at(addresses[i]), n)
            words = _carray(_int32_at(addresses[i]), n)
            s = _block_sum_and_sums_c(values32, words, np.int32(31), np.int32(0x7FFFFFFF), words, weights, factors,
                                      block, out, narrow.view(np.int32))
            low, high = np.float64(narrow[0]), np.float64(narrow[1])
        rows[i, 0], rows[i, 1], rows[i, 2], rows[i, 3] = out[0], out[1], low, high
        rows[i, 4], rows[i, 5], rows[i, 6] = np.float64(n), 0.0, 0.0
        s_bits[i] = s  # rows' last column, as int64


# compiled forms, globals of the functions that call them (set before those are compiled)
_ordered: Any = None
_ordered32: Any = None
_block_sum_and_sums_c: Any = None
_float32_at: Any = None  # an address (int64) as a typed pointer (`_pointers`)
_float64_at: Any = None
_int32_at: Any = None
_int64_at: Any = None
_carray: Any = None  # numba.carray, which makes an array over such a pointer


@functools.cache
def compiled() -> SimpleNamespace | None:
    """The kernels, compiled on the first call; None where numba is not installed."""
    try:
        import numba
    except ImportError:  # pragma: no cover - the lock installs numba; another image may not have it
        return None
    global _ordered, _ordered32, _block_sum_and_sums_c
    _pointers()
    for cache in (True, False):
        jit = functools.partial(numba.njit, nogil=True, boundscheck=False, cache=cache)
        try:
            _ordered = jit(inline="always")(_ordered_of)
            _ordered32 = jit(inline="always")(_ordered32_of)
            _block_sum_and_sums_c = jit(fastmath=_REASSOCIATE)(_block_sum_and_sums)
            return SimpleNamespace(block_sum=jit()(_block_sum), block_sum_and_sums=_block_sum_and_sums_c,
                                   batch_sums=jit()(_batch_sums))
        except RuntimeError:  # no folder numba may cache in (a read-only install, no home folder): compiled each time
            continue
    return None


def _pointers() -> None:
    """The intrinsics that read an address as a typed pointer, and numba.carray, which makes the array over it."""
    global _carray, _float32_at, _float64_at, _int32_at, _int64_at
    from llvmlite import ir
    from numba import carray, types
    from numba.extending import intrinsic

    def at(item):
        def typer(typingctx, address):
            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], ir.PointerType(context.get_value_type(item)))
            return types.CPointer(item)(types.int64), codegen
        typer.__name__ = typer.__qualname__ = f"address_as_{item}"  # an intrinsic is named by its function
        return intrinsic(typer)

    _carray = carray
    _float32_at, _float64_at = at(types.float32), at(types.float64)
    _int32_at, _int64_at = at(types.int32), at(types.int64)


def block_sum_and_sums(kernels: SimpleNamespace, values: np.ndarray, weights: np.ndarray, factors: np.ndarray,
                       block: int) -> tuple[int, tuple[float, float, float, float]]:
    """(S as int64 bits, (sum, sum of squares, min, max)) of a 1-D C-contiguous fp32 or fp64 array. NaN or Inf make
    the sum non-finite."""
    out = np.empty(2)
    extremes = np.empty(2, values.dtype)
    bits, shift, magnitude = _ORDERED[values.itemsize]
    s = kernels.block_sum_and_sums(values, values.view(bits), shift, magnitude, values.view(np.int32), weights, factors,
                                   block, out, extremes.view(bits))
    total, squares = out.tolist()
    low, high = extremes.tolist()
    return int(s), (total, squares, low, high)
