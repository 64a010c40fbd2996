"""Properties of the ULP distance and of digests, on random bit patterns (hypothesis)."""

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.metrics import element_stats, ulp_distance
from harness.store.digest import Digest

FLOATS = {"float32": (np.float32, np.uint32), "bfloat16": (ml_dtypes.bfloat16, np.uint16), "float16": (np.float16, np.uint16)}
SETTINGS = settings(max_examples=150, deadline=None)


def finite_pair(dtype_name: str, bits_a: list[int], bits_b: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of `dtype_name` from bit patterns, non-finite patterns replaced by +0/-0."""
    dtype, uint = FLOATS[dtype_name]
    n = min(len(bits_a), len(bits_b))
    arrays = []
    for bits in (bits_a[:n], bits_b[:n]):
        raw = np.array(bits, dtype=np.uint64).astype(uint)
        values = raw.view(dtype)
        raw[~np.isfinite(values.astype(np.float32))] &= uint(1 << (8 * raw.itemsize - 1))  # keep the sign: +-0
        arrays.append(raw.view(dtype))
    return arrays[0], arrays[1]


def bit_lists(width: int):
    return st.lists(st.integers(0, (1 << width) - 1), min_size=1, max_size=40)


pairs = st.sampled_from(sorted(FLOATS)).flatmap(
    lambda name: st.tuples(st.just(name), bit_lists(8 * np.dtype(FLOATS[name][1]).itemsize),
                           bit_lists(8 * np.dtype(FLOATS[name][1]).itemsize)))


@SETTINGS
@given(pairs)
def test_ulp_distance_is_symmetric(pair):
    a, b = finite_pair(*pair)
    assert np.array_equal(ulp_distance(a, b), ulp_distance(b, a))
    forward, backward = element_stats(a, b), element_stats(b, a)
    assert forward.max_ulp == backward.max_ulp and forward.differing == backward.differing
    assert forward.ulp_histogram == backward.ulp_histogram


@SETTINGS
@given(pairs, st.data())
def test_ulp_distance_is_zero_exactly_when_the_values_are_equal(pair, data):
    a, b = finite_pair(*pair)
    # Make some elements equal (and some of those +0 vs -0) so both directions of "iff" are exercised.
    same = np.array(data.draw(st.lists(st.booleans(), min_size=a.size, max_size=a.size)))
    b[same] = a[same]
    zeros = np.array(data.draw(st.lists(st.booleans(), min_size=a.size, max_size=a.size)))
    a[zeros], b[zeros] = a.dtype.type(0.0), -a.dtype.type(0.0)
    distance = ulp_distance(a, b)
    equal = a.astype(np.float64) == b.astype(np.float64)  # +0 == -0
    assert np.array_equal(distance == 0, equal)
    assert (element_stats(a, b).max_ulp == 0) == bool(equal.all())


@SETTINGS
@given(st.sampled_from(sorted(FLOATS)), st.integers(0, 1 << 16), st.integers(0, 1 << 16), st.booleans())
def test_nan_and_signed_zero_rules(dtype_name, payload_a, payload_b, sign):
    dtype, uint = FLOATS[dtype_name]
    bits = 8 * np.dtype(uint).itemsize
    mantissa = {"float32": 23, "bfloat16": 7, "float16": 10}[dtype_name]
    quiet_nan = ((1 << (bits - 1)) - 1) ^ ((1 << (mantissa - 1)) - 1)  # exponent all ones, top mantissa bit set
    nan_a = quiet_nan | (payload_a % (1 << (mantissa - 1))) | (int(sign) << (bits - 1))
    nan_b = quiet_nan | (payload_b % (1 << (mantissa - 1)))
    a = np.array([nan_a, 0], dtype=uint).view(dtype)
    b = np.array([nan_b, 1 << (bits - 1)], dtype=uint).view(dtype)  # NaN vs NaN, +0 vs -0
    stats = element_stats(a, b)
    assert stats.max_ulp == 0 and stats.nan_mismatch == 0 and stats.signed_zero_only == 1
    assert stats.nan_payload_only == (1 if nan_a != nan_b else 0)
    assert stats.differing == 1 + stats.nan_payload_only
    one = np.array([1.0, 0.0], dtype=dtype)
    assert element_stats(a, one).nan_mismatch == 1  # NaN on one side only: a class, never a distance


@SETTINGS
@given(st.floats(width=32, allow_nan=False, allow_infinity=False), st.integers(1, 64), st.booleans())
def test_ulp_distance_grows_by_one_along_a_nextafter_chain_fp32(start, steps, up):
    chain = [np.float32(start)]
    target = np.float32(np.inf if up else -np.inf)
    for _ in range(steps):
        with np.errstate(over="ignore"):
            following = np.nextafter(chain[-1], target)
        if not np.isfinite(following):
            break
        chain.append(following)
    chain = np.array(chain, dtype=np.float32)
    distances = ulp_distance(np.full_like(chain, chain[0]), chain)
    # k steps away is k ULP, across zero too (+0 and -0 are one point: nextafter(-0.0, inf) is the smallest
    # positive value)
    assert np.array_equal(distances, np.arange(chain.size))
    assert np.all(np.diff(distances) >= 0)


@SETTINGS
@given(st.integers(0, 0x7F7F), st.integers(1, 200), st.booleans())
def test_ulp_distance_grows_by_one_along_bf16_bit_patterns(start, steps, negative):
    bits = np.arange(start, min(start + steps, 0x7F80), dtype=np.uint16)  # positive finite values, ascending
    if negative:
        bits |= np.uint16(0x8000)
    values = bits.view(ml_dtypes.bfloat16)
    distances = ulp_distance(np.full_like(values, values[0]), values)
    assert np.array_equal(distances, np.arange(values.size))
    magnitudes = np.abs(values.astype(np.float32))
    assert np.all(np.diff(magnitudes) > 0)  # the chain is ordered by value: the distance is monotone in it


DTYPES = ["float32", "bfloat16", "float16", "float64", "int32", "int64", "bool"]
NUMPY = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float64": np.float64,
         "int32": np.int32, "int64": np.int64, "bool": np.bool_}


def array_of(dtype_name: str, raw: bytes, rows: int) -> np.ndarray:
    itemsize = np.dtype(NUMPY[dtype_name]).itemsize
    count = max(1, len(raw) // itemsize // rows) * rows
    data = (raw * (count * itemsize // max(len(raw), 1) + 1))[:count * itemsize]
    array = np.frombuffer(bytearray(data), dtype=np.uint8).copy()
    if dtype_name == "bool":
        array &= 1
    return array.view(NUMPY[dtype_name]).reshape(rows, -1)


@SETTINGS
@given(st.sampled_from(DTYPES), st.binary(min_size=1, max_size=256), st.integers(1, 4), st.integers(0, 10 ** 6),
       st.integers(1, 255))
def test_digest_changes_with_any_single_byte(dtype_name, raw, rows, where, flip):
    array = array_of(dtype_name, raw, rows)
    changed = array.copy()
    as_bytes = changed.view(np.uint8).reshape(-1)
    at = where % as_bytes.size
    as_bytes[at] ^= 1 if dtype_name == "bool" else flip  # bool bytes stay 0/1
    assert Digest.of(changed) != Digest.of(array)
    assert Digest.of(changed).md5 != Digest.of(array).md5
    assert Digest.of(array.copy()) == Digest.of(array)  # and only with a change


SAME_WIDTH = {"float32": "int32", "int32": "float32", "float64": "int64", "int64": "float64",
              "bfloat16": "float16", "float16": "bfloat16"}


@SETTINGS
@given(st.sampled_from(sorted(SAME_WIDTH)), st.binary(min_size=1, max_size=256), st.integers(1, 4))
def test_digest_changes_with_dtype_and_shape(dtype_name, raw, rows):
    array = array_of(dtype_name, raw, rows)
    other = array.view(NUMPY[SAME_WIDTH[dtype_name]])  # the same bytes as another dtype
    assert other.tobytes() == array.tobytes()
    assert Digest.of(other) != Digest.of(array) and Digest.of(other).dtype == SAME_WIDTH[dtype_name]
    for shape in [(array.size,), (1, array.size), (array.size, 1), array.shape[::-1]]:
        reshaped = array.reshape(shape)
        if reshaped.shape != array.shape:
            assert Digest.of(reshaped) != Digest.of(array)
            assert Digest.of(reshaped).md5 == Digest.of(array).md5  # same bytes: the shape tells them apart
    assert Digest.of(np.asfortranarray(array.T)) == Digest.of(np.ascontiguousarray(array.T))  # layout is not identity
