"""The host side of the fast digest (harness.store.fast_hash, harness.store.stats) against plain
references written from the definitions: mix64 in Python integers against numpy's, finish / meta_key /
PendingDigest.settle against the numpy forms they replaced, block_sum (chunked, sign-extended, with tails)
against the whole-array sum, and tensor_stats (chunked, fp16 widened by bit tricks, BLAS dots) against
float64 masks, for every dtype a dump holds."""

import functools
import hashlib
import math

import ml_dtypes
import numpy as np
import pytest

from harness.dtypes import dtype_name
from harness.store import cpu_kernels, fast_hash, stats
from harness.store.fast_hash import BLOCK, PendingDigest, block_sum, fast64, fast_entry, finish, meta_key, mix64, mix64_int, raw_bytes
from harness.store.stats import tensor_stats

MASK = (1 << 64) - 1


def reference_finish(s: int, dtype: str, shape: tuple[int, ...], nbytes: int) -> str:
    text = f"{dtype}|{','.join(str(int(d)) for d in shape)}|{int(nbytes)}"
    key = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return f"{int(mix64(np.array([(s & MASK) ^ key], dtype=np.uint64))[0]):016x}"


def reference_block_sum(raw: np.ndarray) -> int:
    """S over the whole array at once: every word times its V[b] * W[c], wrapping uint64."""
    padded = np.zeros(-(-raw.size // 4) * 4, np.uint8)
    padded[:raw.size] = raw
    words = padded.view("<i4").astype(np.int64).view(np.uint64)
    blocks = -(-words.size // BLOCK)
    coefficients = np.tile(fast_hash.block_weights(), blocks)[:words.size] * \
        np.repeat(fast_hash.block_factors(blocks), BLOCK)[:words.size]
    return int((coefficients * words).sum())


def reference_stats(array: np.ndarray) -> dict:
    values = array.reshape(-1).astype(np.float64)
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    values = values[np.isfinite(values)]
    if not values.size:
        return {"min": None, "max": None, "mean": None, "norm": None, "nan": nan, "inf": inf}
    return {"min": values.min(), "max": values.max(), "mean": math.fsum(values) / values.size,
            "norm": math.sqrt(math.fsum(values * values)), "nan": nan, "inf": inf}


def assert_stats(found: dict, expected: dict, label) -> None:
    assert found.keys() == expected.keys(), label
    for key, value in expected.items():
        if value is None or key in ("nan", "inf"):
            assert found[key] == value, (label, key)
        else:
            assert found[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (label, key)


def test_mix64_in_python_integers_matches_numpy():
    rng = np.random.default_rng(0)
    values = [0, 1, 2, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1,
              *(int(v) for v in rng.integers(0, 2**64, 5000, dtype=np.uint64))]
    expected = mix64(np.array(values, dtype=np.uint64))
    assert [mix64_int(v) for v in values] == [int(v) for v in expected]
    assert mix64_int(2**64 + 5) == mix64_int(5) and mix64_int(-1) == mix64_int(2**64 - 1)  # taken mod 2**64
    assert int(fast_hash.block_weights()[12345]) == mix64_int(12346 * 0x9E3779B97F4A7C15) | 1  # the tables, by definition
    assert int(fast_hash.block_factors(8)[7]) == mix64_int(8 * 0xD1B54A32D192ED03) | 1


def test_finish_and_meta_key_match_the_numpy_forms():
    rng = np.random.default_rng(1)
    cases = [("float32", (4096, 1024), 4096 * 1024 * 4), ("bfloat16", (7, 13), 182), ("bool", (), 1), ("int64", (0, 3), 0)]
    for dtype, shape, nbytes in cases:
        for s in (0, 1, MASK, 2**63, -1, 2**64 + 3, *(int(v) for v in rng.integers(0, 2**64, 200, dtype=np.uint64))):
            assert finish(s, dtype, shape, nbytes) == reference_finish(s, dtype, shape, nbytes), (dtype, s)
    # the cache: numpy ints, lists and torch-like tuple subclasses give the key of the plain tuple
    assert finish(5, "float32", [np.int64(3), 4], np.int64(48)) == reference_finish(5, "float32", (3, 4), 48)
    assert meta_key("float32", (3, 4), 48) == meta_key("float32", (np.int64(3), np.int64(4)), 48)
    assert meta_key("float32", (3, 4), 48) != meta_key("float32", (4, 3), 48) != meta_key("float16", (3, 4), 48)


def reference_settle(pending: PendingDigest, row: np.ndarray) -> dict:
    total, squares, low, high, elements, nan, inf = (float(v) for v in row[:7])
    s = int(np.array(row[7:8], dtype=np.float64).view(np.uint64)[0])
    count = int(elements) - int(nan) - int(inf)
    stats_ = {"min": None, "max": None, "mean": None, "norm": None, "nan": int(nan), "inf": int(inf)} if count == 0 \
        else {"min": low, "max": high, "mean": total / count, "norm": float(np.sqrt(squares)), "nan": int(nan), "inf": int(inf)}
    return {"dtype": pending.dtype, "shape": list(pending.shape), "stats": stats_,
            "fast64": reference_finish(s, pending.dtype, pending.shape, pending.nbytes)}


def test_settle_matches_the_numpy_form():
    rng = np.random.default_rng(2)
    bits = [0, 1, MASK, 0x7FF0000000000001, 0x7FF8000000000000, 0xFFF0000000000000, 0x0000000000000001,
            *(int(v) for v in rng.integers(0, 2**64, 300, dtype=np.uint64))]  # NaN, sNaN, Inf, subnormal patterns
    for index, s in enumerate(bits):
        elements = float(rng.integers(1, 10**6))
        nan, inf = (0.0, 0.0) if index % 3 else (float(rng.integers(0, 5)), float(rng.integers(0, 5)))
        if index % 7 == 0:
            nan, inf = elements, 0.0  # no finite values
        row = np.array([rng.standard_normal() * 1e3, rng.random() * 1e6, -rng.random(), rng.random(), elements, nan, inf, 0.0])
        row.view(np.uint64)[7] = s
        pending = PendingDigest("bfloat16", (int(elements),), int(elements) * 2, None)
        pending.settle(row)
        expected = reference_settle(pending, row)
        assert pending.result() == expected, (index, hex(s))
        assert all(type(v) in (float, int, type(None)) for v in pending.result()["stats"].values())
    pending = PendingDigest("float32", (2, 2), 16, None)  # a row from a stacked 2-D array, not contiguous
    rows = np.zeros((8, 3))
    rows[:, 1] = [10.0, 30.0, 1.0, 4.0, 4.0, 0.0, 0.0, 0.0]
    rows[7, 1] = np.array([0x0123456789ABCDEF], np.uint64).view(np.float64)[0]
    pending.settle(rows[:, 1])
    assert pending.result() == reference_settle(pending, rows[:, 1].copy())


@pytest.mark.parametrize("nbytes", [0, 1, 3, 4, 5, 4 * BLOCK - 1, 4 * BLOCK, 4 * BLOCK + 2,
                                    4 * BLOCK * (fast_hash._CHUNK_BLOCKS + 1) + 6])
def test_block_sum_matches_the_whole_array_sum(nbytes):
    rng = np.random.default_rng(nbytes)
    raw = rng.integers(0, 256, nbytes, dtype=np.uint8)
    assert block_sum(raw) == reference_block_sum(raw)
    for fill in (0x80, 0xFF):  # negative words: sign-extended
        assert block_sum(np.full(nbytes, fill, np.uint8)) == reference_block_sum(np.full(nbytes, fill, np.uint8))
    if nbytes > 1:
        assert block_sum(raw[1:]) == reference_block_sum(raw[1:])  # not 4-byte aligned in memory


def samples(rng, n):
    yield "float32", (rng.standard_normal(n) * 100).astype(np.float32)
    yield "bfloat16", (rng.standard_normal(n) * 100).astype(ml_dtypes.bfloat16)
    yield "float16", (rng.standard_normal(n) * 100).astype(np.float16)
    yield "float64", rng.standard_normal(n) * 1e5 + 3
    yield "int32", rng.integers(-2**31, 2**31, n).astype(np.int32)
    yield "int64", rng.integers(-2**40, 2**40, n)
    yield "bool", rng.random(n) < 0.3


@pytest.mark.parametrize("n", [1, 3, stats._ROW - 1, stats._ROW + 1, stats._CHUNK, stats._CHUNK + stats._ROW + 5])
def test_tensor_stats_match_float64_masks(n):
    rng = np.random.default_rng(n)
    for name, array in samples(rng, n):
        assert_stats(tensor_stats(array), reference_stats(array), (name, n))
        if array.dtype.kind in "fV" and n > 2:
            for bad in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf], [np.nan, np.inf]):
                spoiled = array.copy()
                spoiled[rng.choice(n, len(bad), replace=False)] = bad
                assert_stats(tensor_stats(spoiled), reference_stats(spoiled), (name, n, bad))
            assert_stats(tensor_stats(np.full(n, np.nan, array.dtype)), reference_stats(np.full(n, np.nan, array.dtype)), name)


def test_tensor_stats_edges():
    empty = {"min": None, "max": None, "mean": None, "norm": None, "nan": 0, "inf": 0}
    assert tensor_stats(np.zeros((0, 3), np.float32)) == empty
    assert tensor_stats(np.array(2.5, np.float32)) == {"min": 2.5, "max": 2.5, "mean": 2.5, "norm": 2.5, "nan": 0, "inf": 0}
    matrix = np.random.default_rng(3).standard_normal((300, 700)).astype(np.float32).T  # not contiguous
    assert_stats(tensor_stats(matrix), reference_stats(matrix), "transposed")
    extremes = np.array([65504, -65504, 6e-8, -6e-8, 6.1e-5, 0.0, -0.0, 1.0], np.float16)  # largest, subnormals
    assert_stats(tensor_stats(extremes), reference_stats(extremes), "fp16 extremes")
    huge = np.array([1e308, 1e308])  # the float64 sum overflows: mean and norm Inf, as before
    with np.errstate(over="ignore"):
        assert tensor_stats(huge) == {"min": 1e308, "max": 1e308, "mean": math.inf, "norm": math.inf, "nan": 0, "inf": 0}
    assert tensor_stats(np.array([True, True])) == {"min": 1.0, "max": 1.0, "mean": 1.0, "norm": math.sqrt(2), "nan": 0, "inf": 0}


def test_every_fp16_value_widens_exactly(monkeypatch):
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    widened = np.empty(every.size, np.float32)
    stats._fp16_to_fp32(every, widened)
    expected = every.astype(np.float32)
    finite = np.isfinite(expected)
    assert np.array_equal(widened[finite].view(np.uint32), expected[finite].view(np.uint32))  # -0.0 and subnormals too
    assert (np.abs(widened[~finite]) > stats._FP16_MAX).all()  # Inf and NaN: large, so tensor_stats sees them
    assert_stats(tensor_stats(every), reference_stats(every), "every fp16")
    finite_values = every[np.isfinite(every)]
    assert_stats(tensor_stats(finite_values), reference_stats(finite_values), "every finite fp16")
    monkeypatch.setattr(stats, "_SUBNORMAL", np.float32(0))  # as where subnormals read as zero: numpy's cast
    stats._fp16_to_fp32(every, widened)
    assert np.array_equal(widened[finite].view(np.uint32), expected[finite].view(np.uint32))


def test_fast_entry_is_fast64_and_stats():
    rng = np.random.default_rng(4)
    for name, array in samples(rng, 3 * BLOCK + 5):
        array = array.reshape(-1, 1)[::2]  # not contiguous: fast_entry copies once, for both
        entry = fast_entry(array)
        contiguous = np.ascontiguousarray(array)
        assert entry == {"dtype": name, "shape": [array.shape[0], 1], "fast64": fast64(contiguous), "stats": entry["stats"]}
        assert entry["fast64"] == reference_finish(reference_block_sum(raw_bytes(contiguous)), name, contiguous.shape,
                                                   contiguous.nbytes)
        assert_stats(entry["stats"], reference_stats(contiguous), name)


@pytest.mark.parametrize("nbytes", [0, 3, 8, 4 * BLOCK + 2, 4 * BLOCK * 3 + 8])
def test_compiled_block_sum_is_numpys(nbytes):
    """The compiled kernel (harness.store.cpu_kernels) and numpy's block sum agree bit for bit: wrapping int64
    products and sums are the uint64 ones."""
    assert cpu_kernels.compiled() is not None, "numba is in the lock: the compiled path must be the one tested"
    rng = np.random.default_rng(nbytes)
    for raw in (rng.integers(0, 256, nbytes, dtype=np.uint8), np.full(nbytes, 0xFF, np.uint8)):
        assert block_sum(raw) == fast_hash.block_sum_numpy(raw) == reference_block_sum(raw)


@pytest.mark.parametrize("n", [1, 7, BLOCK, 2 * BLOCK + 3])
def test_compiled_fast_entry_is_the_numpy_one(n, monkeypatch):
    """fp32 and fp64 take the one-pass kernel: the same fast64 as numpy's path, the same stats but for the sums'
    last bits (reassociated), NaN and Inf counted by the masks."""
    rng = np.random.default_rng(n)
    arrays = [(rng.standard_normal(n) * 50).astype(np.float32), rng.standard_normal(n) * 1e5]
    for array in list(arrays):
        for bad in ([np.nan], [np.inf, -np.inf]):
            if n > 2:
                spoiled = array.copy()
                spoiled[rng.choice(n, len(bad), replace=False)] = bad
                arrays.append(spoiled)
    compiled = [fast_entry(array) for array in arrays]
    monkeypatch.setattr(cpu_kernels, "compiled", lambda: None)  # as where numba is not installed
    for array, entry in zip(arrays, compiled):
        expected = fast_entry(array)
        assert entry["fast64"] == expected["fast64"] == fast64(array), array.dtype
        assert_stats(entry["stats"], expected["stats"], (array.dtype, n))
        assert_stats(entry["stats"], reference_stats(array), (array.dtype, n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_min_and_max_are_exact(dtype):
    """The kernel takes min and max over the floats' bits as ordered integers: exactly numpy's, for values of both
    signs and every magnitude (subnormals, the largest finite, zeros of both signs), in blocks of any content."""
    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, info.tiny, -info.tiny, info.smallest_subnormal, -info.smallest_subnormal, info.max,
                        -info.max, 1.0, -1.0], dtype=dtype)
    rng = np.random.default_rng(7)
    for n in (1, 2, 9, BLOCK + 1, 2 * BLOCK + 5):
        for _ in range(4):
            scale = 10.0 ** rng.integers(-300 if dtype is np.float64 else -40, 300 if dtype is np.float64 else 38)
            array = (rng.standard_normal(n) * scale).astype(dtype)
            array[rng.integers(0, n, min(n, 3))] = rng.choice(special, min(n, 3))
            if rng.random() < 0.5:
                array = np.abs(array) * rng.choice([-1, 1])  # one sign only: the extremes at one end of the keys
            found = fast_entry(array)["stats"]
            assert (found["min"], found["max"]) == (float(array.min()), float(array.max())), (dtype, n)


def test_kernels_compile_where_numba_cannot_cache(monkeypatch):
    """Where numba finds no folder to cache compiled code in, it refuses cache=True: the kernels are compiled without
    the cache, and the digests stay numpy's."""
    import numba

    real = numba.njit

    def refusing(*args, cache=False, **kwargs):
        if cache:
            raise RuntimeError("cannot cache function: no locator available")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", refusing)
    monkeypatch.setattr(cpu_kernels, "compiled", functools.cache(cpu_kernels.compiled.__wrapped__))
    array = np.random.default_rng(6).standard_normal(BLOCK + 3).astype(np.float32)
    assert cpu_kernels.compiled() is not None
    assert fast_entry(array)["fast64"] == fast64(array) and block_sum(raw_bytes(array)) == fast_hash.block_sum_numpy(raw_bytes(array))


def test_threads_keep_their_own_scratch_buffers():
    """The capture's pool digests tensors on several threads at once: each thread's reused buffers are its own."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    arrays = [array for n in (BLOCK * 9 + 3, stats._CHUNK + 7) for _ in range(3) for _, array in samples(rng, n)]
    expected = [(fast_entry(array)["fast64"], fast_entry(array)["stats"]) for array in arrays]
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda array: (fast_entry(array)["fast64"], fast_entry(array)["stats"]), arrays))
    assert found == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_digests_of_many_tensors_are_fast_entrys(seed):
    """fast_hash.host_digests (one compiled call for a step's float32 and float64 tensors): per tensor the fast64
    and exact min and max of fast_entry, its sums alike but for their last bits; None for a tensor holding NaN or
    Inf, which the caller digests alone."""
    rng = np.random.default_rng(seed)
    arrays = []
    for _ in range(12):
        n = int(rng.choice([1, 3, 64, BLOCK - 1, BLOCK + 5, 3 * BLOCK]))
        array = rng.standard_normal(n) * 10.0 ** rng.integers(-5, 5)
        arrays.append(array.astype(rng.choice([np.float32, np.float64])).reshape(-1, 1) if n % 2 else array.astype(np.float32))
    spoiled = arrays[seed].copy()
    spoiled.reshape(-1)[-1] = rng.choice([np.nan, np.inf])
    arrays[seed] = spoiled
    found = fast_hash.host_digests([(array.ctypes.data, dtype_name(array.dtype), array.shape) for array in arrays])
    assert found[seed] is None
    for i, (array, digest) in enumerate(zip(arrays, found, strict=True)):
        if i == seed:
            continue
        entry, expected = digest.result(), fast_entry(array)
        assert (entry["dtype"], entry["shape"], entry["fast64"]) == (expected["dtype"], expected["shape"], fast64(array))
        assert_stats(entry["stats"], expected["stats"], (array.dtype, array.shape))
        assert (entry["stats"]["min"], entry["stats"]["max"]) == (float(array.min()), float(array.max()))
