"""harness.compare.exact: ULP to the correctly rounded reference, normwise error in units of u, and which of two
sides is closer to the exact result. Properties, checked against plain-Python or direct float64 formulas."""

from __future__ import annotations

import json
import math
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare import exact as exact_module
from harness.compare.exact import UNIT_ROUNDOFF, closer, error_to_exact
from harness.compare.metrics import ULP_BUCKETS
from harness.dtypes import FLOAT_DTYPES, FloatLayout, dtype_name, to_numpy_dtype, unsigned_view
from harness.rounding import round_float64

NARROW = ("bfloat16", "float16", "float32")


def finfo(name: str):
    return ml_dtypes.finfo(to_numpy_dtype(name))


def normal_range(name: str, size: int, seed: int = 0) -> np.ndarray:
    """float64 references whose roundings are normal numbers of `name` (log-uniform magnitudes, both signs)."""
    rng = np.random.default_rng(seed)
    lo, hi = math.log2(float(finfo(name).smallest_normal)) + 1, math.log2(float(finfo(name).max)) - 1
    return rng.choice([-1.0, 1.0], size) * np.exp2(rng.uniform(lo, hi, size))


def ordered(bits: int, name: str) -> int:
    """The ordered integer of a bit pattern: +magnitude for sign 0, -magnitude for sign 1."""
    width = to_numpy_dtype(name).itemsize * 8
    magnitude = bits & ((1 << (width - 1)) - 1)
    return -magnitude if bits >> (width - 1) else magnitude


def step(values: np.ndarray, k: np.ndarray | int) -> np.ndarray:
    """`values` moved by k patterns along the ordered integers (clipped to the finite range)."""
    layout = FloatLayout(dtype_name(values.dtype))
    bits = unsigned_view(values)
    mag = (bits & layout.magnitude_mask).astype(np.int64)
    o = np.where(bits & layout.sign_mask, -mag, mag) + k
    top = int(layout.inf_bits) - 1
    o = np.clip(o, -top, top)
    out = np.where(o < 0, (-o).astype(layout.uint) | layout.sign_mask, o.astype(layout.uint)).astype(layout.uint)
    return out.view(values.dtype)


def double(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def references() -> st.SearchStrategy[np.ndarray]:
    """float64 arrays of any values: every bit pattern (NaN payloads, subnormals, Inf) and hypothesis' floats."""
    any_double = st.integers(0, (1 << 64) - 1).map(double)
    return st.lists(st.one_of(st.floats(width=64), any_double), min_size=1, max_size=40).map(
        lambda xs: np.array(xs, dtype=np.float64))


@pytest.mark.parametrize("name", FLOAT_DTYPES)
def test_correctly_rounded_side_is_0_ulp_and_within_u(name):
    x = normal_range(name, 5000).reshape(50, 100)
    r = round_float64(x, name)
    assert r.dtype == to_numpy_dtype(name)  # bf16 as ml_dtypes arrays
    got = error_to_exact(r, x)
    assert (got.max_ulp, got.finite, got.class_mismatch, got.nonfinite_agree) == (0, x.size, 0, 0)
    assert got.ulp_histogram == {"0": x.size, **dict.fromkeys(ULP_BUCKETS[1:], 0)} and got.mean_ulp == 0
    u = UNIT_ROUNDOFF[name]
    assert np.all(np.abs(r.astype(np.float64) - x) <= u * np.abs(x))  # RNE, element by element
    assert got.unit_roundoff == u and got.normwise <= u and got.normwise_u <= 1 and not got.normwise_absolute
    if name != "float64":
        assert got.normwise_u > 0.1  # not trivially 0: a real rounding error, measured in u


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [1, -1, 2, 3, -5, 17, 1000])
def test_one_element_moved_by_k_ulp(name, k):
    x = np.exp2(np.random.default_rng(1).uniform(-3, 3, 300)) * np.where(np.arange(300) % 2, -1.0, 1.0)
    side = round_float64(x, name)
    at = 123
    side[at] = step(side[at:at + 1], k)[0]
    got = error_to_exact(side, x)
    assert (got.max_ulp, got.max_ulp_flat_index) == (abs(k), at)
    assert math.isclose(got.mean_ulp, abs(k) / x.size)
    bucket = next(label for label, edge in zip(ULP_BUCKETS[::-1], (16, 4, 2, 1, 0)) if abs(k) >= edge)
    assert got.ulp_histogram[bucket] == 1 and got.ulp_histogram["0"] == x.size - 1


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@settings(max_examples=60, deadline=None)
@given(x=references())
def test_rounded_reference_is_0_ulp(name, x):
    got = error_to_exact(round_float64(x, name), x)
    assert got.max_ulp == 0 and got.class_mismatch == 0 and got.finite + got.nonfinite_agree == x.size


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@settings(max_examples=60, deadline=None)
@given(x=references(), data=st.data())
def test_ulp_matches_plain_python_and_is_symmetric(name, x, data):
    width = to_numpy_dtype(name).itemsize * 8
    patterns = data.draw(st.lists(st.integers(0, (1 << width) - 1), min_size=x.size, max_size=x.size))
    side = np.array(patterns, dtype=FloatLayout(name).uint).view(to_numpy_dtype(name))
    r = round_float64(x, name)
    got = error_to_exact(side, x)
    inf = int(FloatLayout(name).inf_bits)
    magnitude = inf | (inf - 1)
    per = [abs(ordered(a, name) - ordered(b, name)) if a & magnitude < inf and b & magnitude < inf else None
           for a, b in zip(map(int, unsigned_view(side)), map(int, unsigned_view(r)))]
    ulps = [d for d in per if d is not None]
    assert got.finite == len(ulps) and got.max_ulp == max(ulps, default=0)
    assert got.max_ulp_flat_index == (per.index(got.max_ulp) if ulps else None)  # the first maximum
    # symmetric: the side as the reference (widened exactly), the correctly rounded value as the side
    back = error_to_exact(r, side.astype(np.float64))
    assert (back.max_ulp, back.finite, back.ulp_histogram, back.mean_ulp) == (got.max_ulp, got.finite, got.ulp_histogram, got.mean_ulp)
    assert back.class_mismatch == got.class_mismatch


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_normwise_is_the_float64_formula(name, data):
    big = min(float(finfo(name).max) / 4, 1e100)  # float64: where the plain formula's squares do not overflow
    magnitudes = st.floats(min_value=-big, max_value=big, allow_subnormal=False)
    x = np.array(data.draw(st.lists(magnitudes, min_size=1, max_size=30)), dtype=np.float64)
    x[np.abs(x) < 1e-100] = 0.0
    k = np.array(data.draw(st.lists(st.integers(-300, 300), min_size=x.size, max_size=x.size)))
    if name == "float64":
        k[x == 0] = 0  # a few float64 subnormals: their squares underflow in the plain formula (not in the module)
    side = step(round_float64(x, name), k)
    got = error_to_exact(side, x)
    d = side.astype(np.float64) - x
    error_norm, exact_norm = math.sqrt(np.sum(d * d)), math.sqrt(np.sum(x * x))
    assert math.isclose(got.error_norm, error_norm, rel_tol=1e-13) and math.isclose(got.exact_norm, exact_norm, rel_tol=1e-13)
    expected = error_norm / exact_norm if exact_norm else error_norm
    assert math.isclose(got.normwise, expected, rel_tol=1e-13) and got.normwise_absolute == (exact_norm == 0)
    assert math.isclose(got.normwise_u, expected / UNIT_ROUNDOFF[name], rel_tol=1e-13)


def test_norms_of_tiny_and_huge_float64_do_not_underflow_or_overflow():
    x = np.ldexp([1.0, 3.0, -2.0], -930)  # squares underflow to 0; x * (1 + 2^-40) is exact
    got = error_to_exact(x * (1 + 2.0 ** -40), x)
    assert math.isclose(got.normwise, 2.0 ** -40, rel_tol=1e-15) and got.exact_norm > 0
    x = np.ldexp([1.0, 3.0, -2.0], 1000)  # squares overflow to inf
    got = error_to_exact(x * (1 + 2.0 ** -40), x)
    assert math.isclose(got.normwise, 2.0 ** -40, rel_tol=1e-15) and math.isfinite(got.exact_norm)


@pytest.mark.parametrize("name", FLOAT_DTYPES)
def test_signed_zero_is_0_ulp(name):
    tiny = float(finfo(name).smallest_subnormal) / 4  # rounds to +0 / -0 (float64: is 0)
    x = np.array([0.0, -0.0, tiny, -tiny, 0.0])
    side = np.array([-0.0, 0.0, -0.0, 0.0, 0.0]).astype(to_numpy_dtype(name))
    got = error_to_exact(side, x)
    assert got.max_ulp == 0 and got.finite == 5 and got.ulp_histogram["0"] == 5


@pytest.mark.parametrize("name", FLOAT_DTYPES)
def test_nan_and_inf_are_classes(name):
    big = float(finfo(name).max)
    over = 2 * big if name != "float64" else math.inf  # a finite float64 reference that overflows the dtype
    x = np.array([1.0, math.nan, math.inf, over, over, 1.0, 1.0, -math.inf, 2.0])
    side = np.array([math.nan, -math.nan, math.inf, math.inf, big, math.inf, 1.0, math.inf, 2.0]).astype(to_numpy_dtype(name))
    side[-1] = step(side[-1:], 3)[0]
    got = error_to_exact(side, x)
    assert (got.nonfinite_agree, got.class_mismatch, got.finite) == (3, 4, 2)  # agree: NaN/NaN, Inf/Inf, overflow/Inf
    assert (got.max_ulp, got.max_ulp_flat_index, got.ulp_histogram["2-3"], got.ulp_histogram["0"]) == (3, 8, 1, 1)
    if name != "float64":  # normwise over the elements where side and exact are both finite: 4 (big vs 2 big), 6, 8
        finite = [4, 6, 8]
        d = side[finite].astype(np.float64) - x[finite]
        assert math.isclose(got.normwise, math.sqrt(np.sum(d * d)) / math.sqrt(np.sum(x[finite] ** 2)), rel_tol=1e-13)
    assert json.dumps(got.to_json(), allow_nan=False)


def test_zero_reference_gives_the_absolute_norm_flagged():
    x = np.zeros(4)
    got = error_to_exact(np.array([0.0, -0.0, 3.0, 4.0], dtype=np.float32), x)
    assert got.normwise_absolute and got.exact_norm == 0 and got.normwise == got.error_norm == 5.0
    assert got.normwise_u == 5.0 / 2.0 ** -24
    got = error_to_exact(np.array([-0.0, 0.0, math.nan, 0.0], dtype=np.float16), np.array([0.0, 0.0, 1.0, math.nan]))
    assert got.normwise_absolute and got.normwise == 0 and got.class_mismatch == 2


def test_float64_side_distances_across_signs_do_not_wrap():
    big = float(np.finfo(np.float64).max)
    got = error_to_exact(np.array([-big, 1.0]), np.array([big, 1.0]))
    assert got.max_ulp == 2 * 0x7FEF_FFFF_FFFF_FFFF and got.max_ulp_flat_index == 0  # 2^64 - 2^53 - 2: above int64
    assert got.error_norm == math.inf  # the float64 difference overflows
    assert json.loads(json.dumps(got.to_json(), allow_nan=False))["error_norm"] == "inf"


@pytest.mark.parametrize("name", ("bfloat16", "float64"))
def test_chunking_changes_nothing(name, monkeypatch):
    x = normal_range(name, 1000, seed=3)
    side = step(round_float64(x, name), np.random.default_rng(4).integers(-40, 40, x.size))
    side[7], x[500] = math.nan, math.inf
    whole, pair = error_to_exact(side, x), closer(side, round_float64(x, name), x)
    monkeypatch.setattr(exact_module, "CHUNK", 37)
    chunked = error_to_exact(side, x)
    for key, value in whole.to_json().items():  # the first maximum's index too, whatever the chunks
        assert value == (pytest.approx(getattr(chunked, key), rel=1e-12) if isinstance(value, float) else getattr(chunked, key)), key
    assert closer(side, round_float64(x, name), x) == pair and pair.elements == 1000


def test_bad_inputs():
    with pytest.raises(ValueError):
        error_to_exact(np.zeros(3, dtype=np.int32), np.zeros(3))
    with pytest.raises(ValueError):
        error_to_exact(np.zeros(3, dtype=np.float32), np.zeros(4))
    with pytest.raises(ValueError):
        error_to_exact(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError):
        closer(np.zeros(3, dtype=np.float32), np.zeros(2, dtype=np.float32), np.zeros(3))


def shares(c) -> tuple[float, float, float]:
    return c.a_share, c.b_share, c.tie_share


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@settings(max_examples=60, deadline=None)
@given(x=references(), data=st.data())
def test_closer_shares(name, x, data):
    width = to_numpy_dtype(name).itemsize * 8
    draw = st.lists(st.integers(0, (1 << width) - 1), min_size=x.size, max_size=x.size)
    a, b = (np.array(data.draw(draw), dtype=FloatLayout(name).uint).view(to_numpy_dtype(name)) for _ in range(2))
    b[::3] = a[::3]  # some bitwise-equal elements
    ab, ba = closer(a, b, x), closer(b, a, x)
    assert ab.a_closer + ab.b_closer + ab.ties == x.size and math.isclose(sum(shares(ab)), 1.0)
    assert (ba.a_closer, ba.b_closer, ba.ties, ba.identical) == (ab.b_closer, ab.a_closer, ab.ties, ab.identical)
    assert shares(ba) == (ab.b_share, ab.a_share, ab.tie_share)
    assert ab.identical >= len(range(0, x.size, 3)) and ab.ties >= ab.identical
    same = closer(a, a, x)
    assert (same.ties, same.identical, same.tie_share) == (x.size, x.size, 1.0)


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@settings(max_examples=60, deadline=None)
@given(x=references(), data=st.data())
def test_correctly_rounded_is_never_farther(name, x, data):
    x = x[np.isfinite(x) & (np.abs(x) <= float(finfo(name).max))]  # RNE: past the largest finite it gives Inf, not the nearest
    width = to_numpy_dtype(name).itemsize * 8
    other = np.array(data.draw(st.lists(st.integers(0, (1 << width) - 1), min_size=x.size, max_size=x.size)),
                     dtype=FloatLayout(name).uint).view(to_numpy_dtype(name))
    r = round_float64(x, name)
    got = closer(r, other, x)
    assert got.b_closer == 0 and got.a_closer + got.ties == x.size
    near = step(r, 1), step(r, -1)  # the neighbouring patterns, the closest competitors
    assert all(closer(r, n, x).b_closer == 0 for n in near)


def test_closer_nan_and_inf_rules():
    x = np.array([1.0, 1.0, 1.0, math.nan, math.inf, 1.0, 1.0, 1.0])
    a = np.array([math.nan, math.nan, math.inf, 1.0, math.inf, 1.5, 0.5, -0.0], dtype=ml_dtypes.bfloat16)
    b = np.array([1.0, math.nan, math.nan, 2.0, 1.0, 0.5, 1.5, 0.0], dtype=ml_dtypes.bfloat16)
    got = closer(a, b, x)
    # b, tie, a (Inf beats NaN), tie (NaN reference), a (the same Inf), tie, tie, tie (+-0, identical)
    assert (got.a_closer, got.b_closer, got.ties, got.identical) == (2, 1, 5, 2)
    assert json.dumps(got.to_json(), allow_nan=False)
    assert closer(np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.float32), np.zeros(0)).tie_share == 0.0


def test_mixed_dtypes_in_closer():
    x = normal_range("bfloat16", 200, seed=5)
    got = closer(round_float64(x, "bfloat16"), round_float64(x, "float32"), x)
    assert got.a_closer == 0 and got.b_closer > 150  # float32 holds the reference more closely
