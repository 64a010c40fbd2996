"""The comparator's numbers, checked against numpy's ULP functions, exhaustively for bf16, and on
hand-made bit patterns."""

import ml_dtypes
import numpy as np
import pytest
from numpy.testing._private.utils import nulp_diff

from harness.compare import metrics
from harness.compare.metrics import element_stats, ulp_distance

BF16 = ml_dtypes.bfloat16


def bits(values, dtype):
    """Arrays from raw bit patterns."""
    width = {np.float16: np.uint16, np.float32: np.uint32, BF16: np.uint16}[dtype]
    return np.asarray(values, dtype=width).view(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_ulp_matches_numpy_nulp_diff(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(200_000) * 10.0 ** rng.integers(-4, 4, 200_000)).astype(dtype)
    b = a.copy()
    raw = b.view(np.uint16 if dtype == np.float16 else np.uint32)
    raw += rng.integers(0, 40, a.size).astype(raw.dtype)
    b[::7] = -b[::7]  # sign flips: distances across zero
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    reference = nulp_diff(a, b).reshape(-1)
    # numpy returns the distance in the input dtype: exact only below 2**(mantissa bits + 1)
    exact = reference < 2.0 ** (np.finfo(dtype).nmant + 1)
    assert exact.sum() > 0.8 * a.size and (~exact).sum() > 1000
    assert np.array_equal(ulp_distance(a, b)[exact], reference[exact].astype(np.int64))
    stats = element_stats(a[exact], b[exact])
    assert stats.max_ulp == int(reference[exact].max())


def test_bf16_ulp_exhaustive_against_rank_in_sorted_values():
    """Every finite bf16 pattern against partners k ranks away, k in 0..64, and against a sample of
    all patterns: the ULP distance is the distance in the sorted list of distinct finite values."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)
    finite = every[np.isfinite(every.astype(np.float32))]
    values = finite.astype(np.float64)
    distinct = np.unique(values)  # +0 and -0 are one value
    rank = np.searchsorted(distinct, values)
    order = np.argsort(values, kind="stable")
    sorted_patterns, sorted_rank = finite[order], rank[order]
    for k in range(0, 65):
        a, b = sorted_patterns[: len(order) - k], sorted_patterns[k:]
        assert np.array_equal(ulp_distance(a, b), np.abs(sorted_rank[k:] - sorted_rank[: len(order) - k]))
    rng = np.random.default_rng(1)
    partners = rng.integers(0, finite.size, 256)
    for p in partners:
        b = np.full(finite.size, finite[p])
        assert np.array_equal(ulp_distance(finite, b), np.abs(rank - rank[p]))


def test_bf16_ulp_is_fp32_ulp_over_65536_for_all_patterns():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)
    every = every[np.isfinite(every.astype(np.float32))]
    rng = np.random.default_rng(2)
    for shift in rng.integers(1, every.size, 64):
        b = np.roll(every, int(shift))
        assert np.array_equal(ulp_distance(every, b) * 65536,
                              ulp_distance(every.astype(np.float32), b.astype(np.float32)))


def test_hand_made_patterns_float32():
    a = bits([0x00000000, 0x80000000, 0x7FC00000, 0x7FC00001, 0x7F800000, 0xFF800000, 0x00000001, 0x3F800000,
              0x3F800000, 0x7F800000, 0x00000001, 0x7F7FFFFF, 0x12345678], np.float32)
    b = bits([0x80000000, 0x00000000, 0x7FC00001, 0x3F800000, 0x7F800000, 0x7F800000, 0x80000001, 0x3F800001,
              0x3F800000, 0x7F7FFFFF, 0x00000002, 0x7F7FFFFF, 0x12345678], np.float32)
    s = element_stats(a, b)
    assert s.elements == 13
    assert s.differing == 9  # indices 4, 8, 11, 12 are equal bit for bit
    assert s.signed_zero_only == 2
    assert s.nan_payload_only == 1
    assert s.nan_mismatch == 1
    assert s.inf_mismatch == 2  # +Inf vs -Inf, +Inf vs max finite
    # finite distances: subnormal 1 vs -1 -> 2 ULP, 1.0 vs next -> 1, 1 vs 2 ULP subnormals -> 1
    assert s.ulp_histogram == {"0": 13 - 3 - 3, "1": 2, "2-3": 1, "4-15": 0, ">=16": 0}
    assert s.max_ulp == 2 and s.max_ulp_flat_index == 6
    assert not s.bitwise_equal and not s.canonical_equal
    assert [w.ulp for w in s.worst[:3]] == [None, None, None]  # class mismatches rank first


def test_nan_payload_only_is_canonically_equal_and_zero_sign_is_not():
    a = bits([0x7FC0, 0x3F80], BF16)
    assert element_stats(a, bits([0xFFC1, 0x3F80], BF16)).canonical_equal
    s = element_stats(bits([0x0000], BF16), bits([0x8000], BF16))
    assert not s.canonical_equal and s.signed_zero_only == 1 and s.max_ulp == 0


def test_abs_and_rel_error_and_indices():
    a = np.array([1.0, 2.0, 0.0, 4.0], dtype=np.float32)
    b = np.array([1.0, 2.5, 0.0, 3.0], dtype=np.float32)
    s = element_stats(a.reshape(2, 2), b.reshape(2, 2))
    assert s.max_abs == 1.0 and s.max_abs_flat_index == 3
    assert s.max_rel == 0.25 and s.max_rel_flat_index in (1, 3)


def test_chunks_and_threads_give_the_same_answer(monkeypatch):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(100_003).astype(np.float32)
    b = a.copy()
    b.view(np.uint32)[rng.integers(0, a.size, 500)] += 5
    b[17] = np.nan
    whole = element_stats(a, b)
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 4096)
    chunked = element_stats(a, b, threads=2)
    assert whole == chunked
    assert whole.max_ulp == 5 and whole.nan_mismatch == 1


def test_integer_tensors_compare_exactly():
    s = element_stats(np.array([1, 2, 3]), np.array([1, 5, 3]))
    assert s.differing == 1 and s.max_ulp == 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, BF16])
def test_whole_block_and_gathered_paths_agree(dtype, monkeypatch):
    """Where many elements differ a block is computed whole, in place; where few do, on the gathered
    differing elements. Both give the same numbers, whatever the chunking, zeros and specials included."""
    rng = np.random.default_rng(4)
    a = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-3, 3, 20_000)).astype(dtype)
    a[::97] = 0.0
    b = a.copy()
    bits = b.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])
    bits[:12_000] += rng.integers(0, 9, 12_000).astype(bits.dtype)  # dense head, sparse tail
    bits[rng.integers(12_000, 20_000, 40)] += 3
    b[:12_000:101] *= -1
    b[:12_000:97] = -0.0  # +0 vs -0: differ, 0 ULP
    b[15_000] = np.inf
    monkeypatch.setattr(metrics, "DENSE_FRACTION", 1 << 40)  # never whole blocks
    gathered = element_stats(a, b)
    monkeypatch.setattr(metrics, "DENSE_FRACTION", 16)
    for chunk, block in [(1 << 22, 1 << 18), (4096, 1024), (1000, 333)]:
        monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", chunk)
        monkeypatch.setattr(metrics, "DENSE_BLOCK", block)
        assert element_stats(a, b, threads=2) == gathered


def test_fp32_block_maxima_found_in_fp32_equal_those_in_fp64(monkeypatch):
    """Whole fp32 blocks look for max abs/rel error in fp32 and confirm the candidates in fp64: the
    same values and indices as computing everything in fp64, ties, subnormals and overflow included."""
    rng = np.random.default_rng(5)
    n = 1 << 14
    a = rng.standard_normal(n).astype(np.float32)
    pairs = [(a, rng.standard_normal(n).astype(np.float32)),
             (a * np.float32(1e-39), a * np.float32(2e-39)),  # subnormals
             (np.clip(a, -1, 1) * np.float32(3e38), np.clip(a, -1, 1) * np.float32(-3e38)),  # |a - b| overflows fp32
             (a, (a * np.float32(1.5)).astype(np.float32)),  # one relative error everywhere: ties
             (np.where(np.arange(n) % 1000 == 0, np.float32(0), a), a + np.float32(1e-3))]  # a = 0: rel is inf
    monkeypatch.setattr(metrics, "DENSE_BLOCK", 4096)
    for x, y in pairs:
        found = element_stats(x, y)
        with monkeypatch.context() as fp64:
            fp64.setattr(metrics, "_abs_rel_fp32", lambda *args: False)
            assert element_stats(x, y) == found
