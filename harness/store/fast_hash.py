"""`fast64`: a 64-bit digest of a tensor's bytes that a GPU computes in place (MD5 cannot be computed on a
GPU, and copying every tensor to the host to hash it costs a capture 75-250x the step on an H200), so
that a capture in digest mode with hash="fast" moves only a few scalars per tensor to the host.

Definition (what numpy here, torch in harness.frameworks.torch, on CPU and CUDA, compute alike):

    raw       the tensor's C-order little-endian bytes, n of them, padded with zeros to a multiple of 4
    w[i]      raw read as little-endian signed int32 words, sign-extended to 64 bits (i = 0 .. ceil(n/4)-1)
    b, c      i = b * BLOCK + c  (BLOCK = 65536 words)
    mix64(z)  the SplitMix64 finalizer, mod 2**64:
                z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31
    W[c]      mix64((c + 1) * 0x9E3779B97F4A7C15) | 1          (odd)
    V[b]      mix64((b + 1) * 0xD1B54A32D192ED03) | 1          (odd)
    S         sum over b of V[b] * (sum over c of W[c] * w[b*BLOCK + c])      mod 2**64
    K         the first 8 bytes (little-endian) of BLAKE2b("<dtype>|<d0,d1,...>|<n>", digest_size=8)
    fast64    mix64(S ^ K), written as 16 lowercase hex digits

W and V are odd, so invertible mod 2**64: a change of any one word by d != 0 (|d| < 2**32) changes S by
V[b] * W[c] * d != 0, and mix64 is a bijection, so it always changes fast64. Padding with zeros adds
nothing to S; the byte length, dtype and shape enter through K. Sums mod 2**64 do not depend on the
order of the additions, so a parallel reduction (torch's, on any device) gives the same S.
It is not a cryptographic hash: it detects changes, it does not resist forgery.

Statistics beside it are those of harness.store.stats (over finite values, in float64).
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.dtypes import dtype_name, unsigned_view
from harness.store import cpu_kernels
from harness.store.stats import scratch, stats_of_sums, tensor_stats

BLOCK = 65536  # words per block
HASHES = ("md5", "fast")
_MASK = (1 << 64) - 1
_W_STEP, _V_STEP = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
# blocks widened to 64 bits at a time, into one buffer (4 MiB of uint64, kept per thread: stats.scratch) reused for
# every chunk: it bounds the temporary memory, and smaller chunks pay more in numpy calls than they win in cache
_CHUNK_BLOCKS = 8

# The values one device digest moves to the host, in this order (float64 each; S as its 64 bits)
SLOTS = ("sum", "sumsq", "min", "max", "elements", "nan", "inf", "s")  # sums and extremes over finite values


def mix64(z: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer on uint64 values (wrapping)."""
    z = z.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return z


def mix64_int(z: int) -> int:
    """mix64 of one value in Python integers (bit for bit `mix64`; numpy on a 1-element array costs ~10x more)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def _constants(count: int, step: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return mix64(np.arange(1, count + 1, dtype=np.uint64) * np.uint64(step)) | np.uint64(1)


_LOCK = threading.Lock()
_V_CACHE: list[np.ndarray] = [np.zeros(0, np.uint64)]
_W: np.ndarray | None = None


def block_weights() -> np.ndarray:
    """W: BLOCK odd uint64 constants (computed once)."""
    global _W
    if _W is None:
        _W = _constants(BLOCK, _W_STEP)
    return _W


@functools.cache
def block_weights64() -> np.ndarray:
    """W as int64, what the compiled kernels read."""
    return block_weights().view(np.int64)


def block_factors(count: int) -> np.ndarray:
    """V[0 .. count-1], odd uint64 (a cached table, grown to the next power of two)."""
    with _LOCK:
        if _V_CACHE[0].size < count:
            _V_CACHE[0] = _constants(1 << max(count - 1, 0).bit_length(), _V_STEP)
        return _V_CACHE[0][:count]


def words_of(nbytes: int) -> int:
    return -(-nbytes // 4)


def blocks_of(nbytes: int) -> int:
    return -(-words_of(nbytes) // BLOCK)


@functools.lru_cache(maxsize=4096)  # a capture digests the same tensors, so the same keys, every step
def meta_key(dtype: str, shape: tuple[int, ...], nbytes: int) -> int:
    text = f"{dtype}|{','.join(str(int(d)) for d in shape)}|{int(nbytes)}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def finish(s: int, dtype: str, shape: tuple[int, ...], nbytes: int) -> str:
    """fast64 from the block sum S and what K is made of."""
    return f"{mix64_int((s & _MASK) ^ meta_key(dtype, tuple(shape), nbytes)):016x}"


def block_sum(raw: np.ndarray) -> int:
    """S of a 1-D uint8 array of the bytes: compiled (harness.store.cpu_kernels) where numba is, else numpy."""
    kernels = cpu_kernels.compiled()
    if kernels is None:
        return block_sum_numpy(raw)
    if raw.size % 4:
        raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])  # whole words: the zeros add nothing
    factors = block_factors(blocks_of(raw.size)).view(np.int64)
    return int(kernels.block_sum(raw.view("<i4"), block_weights64(), factors, BLOCK)) & _MASK


def block_sum_numpy(raw: np.ndarray) -> int:
    """S of a 1-D uint8 array of the bytes (numpy, wrapping uint64 arithmetic)."""
    nbytes = raw.size
    full = nbytes // (4 * BLOCK)
    weights = block_weights()
    factors = block_factors(blocks_of(nbytes))
    words = raw[:full * 4 * BLOCK].view("<i4").reshape(full, BLOCK)
    wide = scratch("block_sum", min(full, _CHUNK_BLOCKS) * BLOCK, np.uint64).reshape(-1, BLOCK)
    total = 0  # a Python int, masked once at the end
    for start in range(0, full, _CHUNK_BLOCKS):
        rows = wide[:min(full - start, _CHUNK_BLOCKS)]
        # int32 -> uint64 casts modularly, i.e. sign-extends; then multiply and row sums, which wrap mod 2**64
        # (a little faster than einsum "ij,j->i", whose uint64 multiply-add is the bottleneck either way)
        np.copyto(rows, words[start:start + len(rows)], casting="unsafe")
        rows *= weights
        total += int(np.einsum("i,i->", rows.sum(axis=1), factors[start:start + len(rows)]))
    tail = raw[full * 4 * BLOCK:]
    if tail.size % 4:
        tail = np.concatenate([tail, np.zeros(4 - tail.size % 4, np.uint8)])  # whole words: the zeros add nothing
    if tail.size:
        tail_words = tail.view("<i4").astype(np.uint64)  # modular: sign-extends
        total += int(np.einsum("i,i->", tail_words, weights[:tail_words.size])) * int(factors[full])
    return total & _MASK


def stats_tolerance(dtype: str) -> float:
    """The relative error of a device digest's mean and norm against numpy's (harness.store.stats), of the
    largest magnitude for the mean (a sum may cancel): float64 sums in another order, 1e-12; the fused GPU kernel
    sums a column of 2-byte floats in float32 first (harness.frameworks.triton_kernels: at most 16 terms, so
    within 16 * 2**-24 of their magnitudes), 1e-6. min, max and the counts are exact."""
    return 1e-6 if dtype in ("bfloat16", "float16") else 1e-12


STATS_KEYS = ("min", "max", "mean", "norm", "nan", "inf")


def stats_mismatches(found: dict, expected: dict, dtype: str) -> list[str]:
    """The statistics of a device digest (`found`) that are not numpy's (`expected`, harness.store.stats) within
    `stats_tolerance`: relative, and for the mean of the largest magnitude too (a sum may cancel). None matches
    only None; min, max and the counts match exactly within any tolerance."""
    tolerance = stats_tolerance(dtype)
    largest = max(abs(expected["min"] or 0.0), abs(expected["max"] or 0.0))
    wrong = []
    for key in STATS_KEYS:
        a, b = found[key], expected[key]
        if a is None or b is None:
            close = a is b
        else:
            close = math.isclose(a, b, rel_tol=tolerance, abs_tol=max(1e-12, tolerance * (largest if key == "mean" else 0.0)))
        if not close:
            wrong.append(key)
    return wrong


def raw_bytes(array: np.ndarray) -> np.ndarray:
    """The array's C-order bytes as 1-D uint8 (no copy for a C-contiguous array)."""
    return unsigned_view(array).reshape(-1).view(np.uint8)


def fast64(array: np.ndarray) -> str:
    """fast64 of a numpy array (bf16 as ml_dtypes.bfloat16), by the definition in the module's note."""
    raw = raw_bytes(array)
    shape = tuple(int(n) for n in array.shape)
    return finish(block_sum(raw), dtype_name(array.dtype), shape, raw.size)


_KERNEL_NAMES = {dtype: dtype_name(dtype) for dtype in cpu_kernels.FLOAT_DTYPES}  # what the compiled kernel reads
HOST_BATCHED = {name: dtype for dtype, name in _KERNEL_NAMES.items()}  # the dtypes host_digests reads, by name
_FACTORS64: dict[int, np.ndarray] = {}  # blocks -> V[0 .. blocks-1] as int64, what the kernel reads


def _factors64(blocks: int) -> np.ndarray:
    factors = _FACTORS64.get(blocks)
    if factors is None:
        factors = _FACTORS64[blocks] = block_factors(blocks).view(np.int64)
    return factors


def fast_entry(array: np.ndarray) -> dict:
    """An unstored tensor's entry of a dump with hash="fast" (computed on the host): dtype, shape,
    fast64 and stats (no MD5, no XXH3). A capture on the CPU runs it ~70 times per step on the training thread."""
    name = _KERNEL_NAMES.get(array.dtype)
    if name is not None and array.size and (kernels := cpu_kernels.compiled()) is not None:  # one pass for all
        values = (array if array.flags.c_contiguous else np.ascontiguousarray(array)).reshape(-1)  # C order
        shape, nbytes = array.shape, values.nbytes
        s, sums = cpu_kernels.block_sum_and_sums(kernels, values, block_weights64(), _factors64(blocks_of(nbytes)), BLOCK)
        return {"dtype": name, "shape": list(shape), "fast64": finish(s, name, shape, nbytes),
                "stats": stats_of_sums(values, sums)}
    raw = raw_bytes(array)  # a copy only where the array is not C-contiguous: then made once, for both
    shape = tuple(int(n) for n in array.shape)
    dtype = dtype_name(array.dtype)
    return {"dtype": dtype, "shape": list(shape), "fast64": finish(block_sum(raw), dtype, shape, raw.size),
            "stats": tensor_stats(raw.view(array.dtype))}


@dataclass
class PendingDigest:
    """A digest an adapter started where the tensor lives (harness.frameworks `device_digest`): `values`
    is the framework's handle to the SLOTS scalars on the device, read by the adapter's `fetch_digests`
    at the step's end, then `settle` makes the dump entry (or `row` keeps them, made into the entry when asked)."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    values: Any
    entry: dict | None = field(default=None)
    row: Any = field(default=None)  # the SLOTS row on the host, not made into the entry yet (`result` does)

    @property
    def fetched(self) -> bool:
        """Whether its values are on the host (as the entry, or as `row`)."""
        return self.entry is not None or self.row is not None

    def settle(self, row: np.ndarray) -> None:
        """Make the entry from the SLOTS row moved to the host (float64; S as its bits)."""
        # Python floats and ints, no numpy scalars: this runs per tensor per step, on the capture's critical path
        row = np.asarray(row, dtype=np.float64)
        total, squares, low, high, elements, nan, inf = row[:7].tolist()
        s = int(row.view(np.uint64)[7])  # the bits, NaN patterns too
        nan, inf = int(nan), int(inf)
        count = int(elements) - nan - inf  # the finite values
        stats = {"min": None, "max": None, "mean": None, "norm": None, "nan": nan, "inf": inf} if count == 0 \
            else {"min": low, "max": high, "mean": total / count,
                  "norm": math.sqrt(squares) if squares >= 0 else math.nan,  # as np.sqrt, which gives NaN below 0
                  "nan": nan, "inf": inf}
        self.entry = {"dtype": self.dtype, "shape": list(self.shape),
                      "fast64": finish(s, self.dtype, self.shape, self.nbytes), "stats": stats}

    def result(self) -> dict:
        """The entry (as a Future's result: the capture treats both alike)."""
        if self.entry is None and self.row is not None:
            self.settle(self.row)
        assert self.entry is not None, "fetch_digests has not run"
        return self.entry


def host_digests(tensors: list[tuple[int, str, tuple[int, ...]]]) -> list[PendingDigest | None]:
    """Digests computed now, in one compiled call, of C-contiguous, non-empty float32 or float64 tensors in the
    host's memory, given as (address, dtype name, shape): a step's parameters, gradients and optimizer states on the
    CPU. Each keeps its SLOTS row, made into the entry when asked (`PendingDigest.result`), as a device digest's;
    fast64 as fast_entry's, the sums of the same kernel. None where numba is missing, or where a tensor holds NaN
    or Inf (its sum is not finite): digest those one by one. The caller keeps the tensors alive and unchanged
    until this returns."""
    kernels = cpu_kernels.compiled()
    if kernels is None or not tensors:
        return [None] * len(tensors)
    count = len(tensors)
    addresses, counts, wide = np.empty(count, np.int64), np.empty(count, np.int64), np.empty(count, np.bool_)
    nbytes = []
    for i, (address, name, shape) in enumerate(tensors):
        n, size = math.prod(shape), HOST_BATCHED[name].itemsize
        addresses[i], counts[i], wide[i] = address, n, size == 8
        nbytes.append(n * size)
    largest = max(nbytes)
    rows = np.empty((count, len(SLOTS)))
    kernels.batch_sums(addresses, counts, wide, block_weights64(), _factors64(blocks_of(largest)), BLOCK, rows,
                       rows.view(np.int64)[:, 7])
    found: list[PendingDigest | None] = []
    for (_, name, shape), row, size, total in zip(tensors, rows, nbytes, rows[:, 0].tolist(), strict=True):
        found.append(PendingDigest(name, shape, size, None, row=row)
                     if math.isfinite(total) else None)
    return found


def settled_digest(array: np.ndarray) -> PendingDigest:
    """A digest computed now, on the host (numpy), for a tensor whose memory is the host's: no copy is
    made, so the caller must not let the tensor change before this returns."""
    entry = fast_entry(array)
    return PendingDigest(entry["dtype"], tuple(entry["shape"]), array.nbytes, None, entry)
