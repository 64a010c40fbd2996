"""harness.rounding against IEEE round-to-nearest-even written out in plain Python (exact rationals), and against
numpy's own float64 -> float16 / float32 casts (the hardware's IEEE conversions: a second, independent reference)."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.rounding import round_float64

# name: (exponent bits, stored mantissa bits)
FORMATS = {"bfloat16": (8, 7), "float16": (5, 10), "float32": (8, 23)}
UINT = {"bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32}


def double(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def double_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def decode(pattern: int, name: str) -> Fraction:
    """The value of a non-negative pattern of the format; the Inf pattern decodes, by the same formula, to
    2^(emax+1): the virtual next value above the largest finite (its pattern is even)."""
    exp_bits, mant = FORMATS[name]
    bias = (1 << (exp_bits - 1)) - 1
    e, f = pattern >> mant, pattern & ((1 << mant) - 1)
    if e == 0:
        return Fraction(f) * Fraction(2) ** (1 - bias - mant)
    return Fraction((1 << mant) + f) * Fraction(2) ** (e - bias - mant)


def reference(x: float, name: str) -> int:
    """The IEEE round-to-nearest-even of the double `x` to `name`, as a bit pattern."""
    exp_bits, mant = FORMATS[name]
    sign = (double_bits(x) >> 63) << (exp_bits + mant)
    inf = ((1 << exp_bits) - 1) << mant
    if math.isnan(x):
        return sign | inf | (1 << (mant - 1))  # the quiet NaN harness.rounding documents
    if math.isinf(x):
        return sign | inf
    value = Fraction(abs(x))  # exact
    if value >= decode(inf, name):
        return sign | inf
    low, high = 0, inf  # decode is increasing on 0..inf: find the largest pattern <= value
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if decode(middle, name) <= value else (low, middle)
    below, above = value - decode(low, name), decode(low + 1, name) - value
    nearest = low if below < above else low + 1 if above < below else low + (low & 1)
    return sign | nearest  # low + 1 == inf: rounded up past the largest finite


def rounded(values, name: str) -> np.ndarray:
    out = round_float64(np.asarray(values, dtype=np.float64), name)
    assert out.dtype == round_float64(np.zeros(1), name).dtype and out.shape == np.shape(values)
    return out.view(UINT[name])


def edge_cases(name: str) -> list[float]:
    exp_bits, mant = FORMATS[name]
    emax = (1 << (exp_bits - 1)) - 1
    emin = 1 - emax
    ulp1 = 2.0 ** -mant
    max_finite = (2 - ulp1) * 2.0 ** emax
    overflow = 2.0 ** (emax + 1) - 2.0 ** (emax - mant - 1)  # the midpoint: rounds to Inf
    min_sub = 2.0 ** (emin - mant)
    carry = 2.0 ** emin - min_sub / 2  # midpoint of the largest subnormal (odd) and the least normal
    ties = [1 + ulp1 / 2, 1 + 3 * ulp1 / 2, 2 + ulp1, 2 + 3 * ulp1, min_sub * 1.5, min_sub * 2.5, carry]
    around = [overflow, min_sub / 2, carry, *ties]
    cases = [0.0, 1.0, max_finite, 2.0 ** (emax + 1), min_sub, 2.0 ** emin, 2.0 ** emin - min_sub,
             1e300, 5e-324, 2.2250738585072014e-308, math.inf]
    cases += around + [math.nextafter(x, d) for x in around for d in (math.inf, 0.0)]
    cases += [math.nextafter(max_finite, d) for d in (math.inf, 0.0)]
    return sorted(set(cases + [-x for x in cases]), key=lambda x: (abs(x), x))


@pytest.mark.parametrize("name", FORMATS)
def test_edge_cases_match_the_ieee_reference(name):
    cases = edge_cases(name)
    got = rounded(cases, name)
    for x, pattern in zip(cases, got):
        assert int(pattern) == reference(x, name), f"{name}: {x!r} ({x.hex()}) -> {int(pattern):#x}"


@pytest.mark.parametrize("name", FORMATS)
def test_edge_cases_named(name):
    exp_bits, mant = FORMATS[name]
    emax = (1 << (exp_bits - 1)) - 1
    emin = 1 - emax
    sign, inf = 1 << (exp_bits + mant), ((1 << exp_bits) - 1) << mant
    max_pattern = inf - 1
    max_finite = (2 - 2.0 ** -mant) * 2.0 ** emax
    overflow = 2.0 ** (emax + 1) - 2.0 ** (emax - mant - 1)
    min_sub = 2.0 ** (emin - mant)
    carry = 2.0 ** emin - min_sub / 2
    one = ((1 << (exp_bits - 1)) - 1) << mant  # 1.0
    expected = [  # (value, pattern): a list, as -0.0 and 0.0 would be one key of a dict
        (1 + 2.0 ** -(mant + 1), one),  # a tie: down to the even 1.0
        (1 + 3 * 2.0 ** -(mant + 1), one + 2),  # a tie: up to the even 1 + 2 ulp
        (math.nextafter(1 + 2.0 ** -(mant + 1), math.inf), one + 1),
        (math.nextafter(1 + 3 * 2.0 ** -(mant + 1), 0.0), one + 1),
        (max_finite, max_pattern),
        (math.nextafter(overflow, 0.0), max_pattern),
        (overflow, inf),
        (math.nextafter(overflow, math.inf), inf),
        (-overflow, sign | inf),
        (min_sub, 1),
        (min_sub / 2, 0),  # a tie: to the even 0
        (math.nextafter(min_sub / 2, math.inf), 1),
        (-min_sub / 2, sign),  # -0
        (carry, 1 << mant),  # the largest subnormal rounds up into the least normal
        (math.nextafter(carry, 0.0), (1 << mant) - 1),
        (-0.0, sign),
        (0.0, 0),
        (math.inf, inf),
        (-math.inf, sign | inf),
        (5e-324, 0),  # double subnormals: far below every target's least subnormal
        (-5e-324, sign),
    ]
    got = rounded([x for x, _ in expected], name)
    assert [(x, int(g)) for (x, _), g in zip(expected, got)] == expected


@pytest.mark.parametrize("name", FORMATS)
def test_nan_is_quiet_and_keeps_its_sign(name):
    exp_bits, mant = FORMATS[name]
    quiet = (((1 << exp_bits) - 1) << mant) | (1 << (mant - 1))
    nans = [double(0x7FF8_0000_0000_0000), double(0x7FF0_0000_0000_0001), double(0x7FFF_FFFF_FFFF_FFFF),
            double(0xFFF8_0000_0000_0000), double(0xFFF0_0000_0000_0001), double(0xFFF4_0000_0000_1234)]
    got = rounded(nans, name)
    assert [int(g) for g in got] == [quiet] * 3 + [quiet | 1 << (exp_bits + mant)] * 3


def test_double_rounding_example():
    # Through float32 (ml_dtypes 0.6.0) 1 + 2^-8 + 2^-30 would round to 1 + 2^-8, a tie, then down to 0x3f80.
    assert int(rounded([1 + 2**-8 + 2**-30], "bfloat16")[0]) == 0x3F81
    assert int(rounded([-(1 + 2**-8 + 2**-30)], "bfloat16")[0]) == 0xBF81


def test_shapes_and_float64():
    x = np.random.default_rng(1).normal(size=(3, 1, 4, 5))
    assert round_float64(x, "float32").shape == x.shape
    assert round_float64(x[:, :, ::2], "bfloat16").shape == (3, 1, 2, 5)  # not contiguous
    same = round_float64(x, "float64")
    assert same.dtype == np.float64 and np.array_equal(same, x) and same is not x
    assert round_float64(np.zeros(0), "float16").shape == (0,)


def near_patterns(name: str) -> st.SearchStrategy[float]:
    """Doubles at and around the target's values and the midpoints between them (where rounding is decided)."""
    exp_bits, mant = FORMATS[name]
    top = ((1 << exp_bits) - 1) << mant

    def build(pattern: int, midpoint: bool, ulps: int, negative: bool) -> float:
        value = (decode(pattern, name) + decode(pattern + 1, name)) / 2 if midpoint else decode(pattern, name)
        x = float(value)  # exact: every target value and midpoint is a double
        for _ in range(abs(ulps)):
            x = math.nextafter(x, math.copysign(math.inf, ulps))
        return -x if negative else x

    return st.builds(build, st.integers(0, top - 1), st.booleans(), st.integers(-2, 2), st.booleans())


def any_double() -> st.SearchStrategy[float]:
    return st.integers(0, (1 << 64) - 1).map(double)  # every bit pattern, NaN payloads included


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_matches_the_ieee_reference(name, data):
    values = data.draw(st.lists(st.one_of(st.floats(width=64), any_double(), near_patterns(name)), min_size=1, max_size=40))
    got = rounded(values, name)
    for x, pattern in zip(values, got):
        assert int(pattern) == reference(x, name), f"{name}: {x!r} ({x.hex()}) -> {int(pattern):#x}"


@pytest.mark.parametrize("name, dtype", [("float16", np.float16), ("float32", np.float32)])
def test_matches_numpy_hardware_casts(name, dtype):
    rng = np.random.default_rng(7)
    exp_bits, _ = FORMATS[name]
    emax = (1 << (exp_bits - 1)) - 1
    # Magnitudes over the whole range, from below the least subnormal to past overflow; and raw bit patterns.
    scales = 2.0 ** rng.integers(-emax - 30, emax + 3, size=1 << 18)
    # Exact ties: midpoints of adjacent target values (exact in float64), signed, and a double ulp either side.
    low = rng.integers(0, ((1 << exp_bits) - 1) << FORMATS[name][1], size=1 << 16).astype(UINT[name])
    ties = (low.view(dtype).astype(np.float64) + (low + 1).view(dtype).astype(np.float64)) / 2
    ties = np.concatenate([ties, -ties])
    values = np.concatenate([rng.normal(size=1 << 18) * scales, rng.integers(0, 1 << 64, size=1 << 18, dtype=np.uint64).view(np.float64),
                             ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), [0.0, -0.0, np.inf, -np.inf]])
    finite_or_inf = ~np.isnan(values)  # NaN payloads: the hardware keeps some, harness.rounding drops them
    with np.errstate(over="ignore"):
        expected = values[finite_or_inf].astype(dtype).view(UINT[name])
    got = rounded(values, name)[finite_or_inf]
    assert np.array_equal(got, expected), f"{np.count_nonzero(got != expected)} differ"
