"""How far one side is from an exact (float64) reference, and which of two sides is closer to it.

Inputs: `side`, an array of bfloat16 (ml_dtypes), float16, float32 or float64, and `exact`, a float64 array of
the same shape: the same computation done in float64 from the same input bits. Elements are taken in C order;
an index is the flat C-order index.

ULP to exact (`error_to_exact`), per element:
  r = round_float64(exact, side's dtype): the reference rounded once, to nearest-even (harness.rounding); for a
  float64 side, r = exact. The distance is harness.compare.metrics' ULP distance in the side's own dtype (never
  upcast): |ord(side) - ord(r)|, ord(x) = +magnitude bits for sign 0, -magnitude bits for sign 1; so +0 and -0
  are 0 ULP apart, and 0 ULP means the side IS the correctly rounded value. Only elements where side and r are
  both finite get a ULP (`finite`); max, mean and histogram (metrics.ULP_BUCKETS) are over those. Side and r
  both NaN (any payload or sign), or the same Inf: `nonfinite_agree`. Every other pair with a NaN or Inf is a
  `class_mismatch` (e.g. a finite side where the reference overflows the dtype to Inf, or the reverse).

Normwise relative error: ||side - exact||_2 / ||exact||_2 in float64, over the elements where side and exact are
  both finite (the side widened exactly to float64; each difference rounded once in float64; sums of squares
  scaled by powers of two, which is exact, so nothing under- or overflows). `normwise_u` is it in units of the
  dtype's unit roundoff u = 2^-p, p the significand's precision: bf16 2^-8, fp16 2^-11, fp32 2^-24, fp64 2^-53.
  Round-to-nearest-even gives |r - x| <= u|x| for x in the normal range, so the correctly rounded side has
  normwise_u <= 1 (subnormal results may exceed it). If ||exact||_2 == 0 (every finite reference element is
  zero, or none is finite), a relative error is undefined: `normwise` is then the absolute ||side - exact||_2
  and `normwise_absolute` is True.

Closer (`closer(a, b, exact)`), per element: the distances |a - x| and |b - x| in float64, 0 where the side
  equals x (so a matching Inf is 0 away). The smaller is closer; equal distances tie (bitwise-equal sides
  among them: `identical` counts the ties where a and b are one value, both NaN included). A NaN distance (a
  NaN side, or a NaN reference) is farther than any number, Inf included; two NaN distances tie. Rounding the
  difference is monotone, so a strict order can only show as a tie, never reversed (and for a side within a
  factor 2 of x the difference is exact, by Sterbenz's lemma).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

# Private on purpose: one ULP definition and one bucket scheme for side-vs-side and side-vs-exact. Not
# metrics.ulp_distance: it casts to int64, and float64 distances reach 2**64 - 2.
from harness.compare.metrics import _EDGES, ULP_BUCKETS, _ulp_bits
from harness.dtypes import FLOAT_DTYPES, FloatLayout, dtype_name, unsigned_view
from harness.rounding import round_float64

CHUNK = 1 << 20  # elements at a time: a few float64 copies of a chunk, whatever the tensor's size
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def _json(value):
    # strict JSON, as harness.reports.json_report writes it: non-finite floats as "inf", "-inf", "nan"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


@dataclass(frozen=True)
class ExactError:
    dtype: str
    elements: int
    finite: int  # side and rounded reference both finite: the elements given a ULP
    nonfinite_agree: int  # both NaN, or the same Inf
    class_mismatch: int  # any other NaN/Inf pair
    max_ulp: int
    max_ulp_flat_index: int | None  # the first maximum; None when no element is finite
    mean_ulp: float
    ulp_histogram: dict[str, int]  # metrics.ULP_BUCKETS over the finite elements
    unit_roundoff: float
    error_norm: float  # ||side - exact||_2 over elements where both are finite
    exact_norm: float  # ||exact||_2 over the same elements
    normwise: float  # error_norm / exact_norm; error_norm where exact_norm == 0
    normwise_u: float  # normwise / unit_roundoff
    normwise_absolute: bool  # exact_norm == 0: normwise is absolute

    def to_json(self) -> dict:
        return {key: _json(value) for key, value in asdict(self).items()}


@dataclass(frozen=True)
class Closeness:
    elements: int
    a_closer: int
    b_closer: int
    ties: int
    identical: int  # ties where a and b hold one value (both NaN included)
    a_share: float  # a_closer / elements; all shares are 0 for an empty tensor
    b_share: float
    tie_share: float

    def to_json(self) -> dict:
        return asdict(self)


def _flat(side: np.ndarray, exact: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    name = dtype_name(side.dtype)
    if name not in FLOAT_DTYPES:
        raise ValueError(f"a side must be a float tensor, not {name}")
    if np.dtype(exact.dtype) != np.float64 or side.shape != exact.shape:
        raise ValueError(f"exact must be float64 of the side's shape {side.shape}, not {exact.dtype} {exact.shape}")
    return np.ascontiguousarray(side).reshape(-1), np.ascontiguousarray(exact).reshape(-1), name


def _square_sum(x: np.ndarray) -> tuple[float, int]:
    """sum(x**2) as (s, k), the sum being s * 4**k: x is scaled by 2**-k, k the exponent of the power of two
    above its largest magnitude (exact), so squares of huge values do not overflow and those of tiny ones do
    not vanish. Where the largest magnitude is within 2**+-400 the scaling can wait: x @ x equals the scaled
    sum times 4**k up to its own rounding, and a square that underflows is below 2**-1022 while the sum is at
    least top**2 >= 2**-800, far below the sum's rounding."""
    if not x.size:
        return 0.0, 0
    top = max(float(x.max()), -float(x.min()))
    if top == 0:
        return 0.0, 0
    k = math.frexp(top)[1]
    if -400 < k < 400:
        return float(x @ x) * 0.25 ** k, k
    return float(np.sum(np.square(np.ldexp(x, -k)))), k


class _Squares:
    """A sum of squares kept as s * 4**k (_square_sum), chunk after chunk."""

    def __init__(self) -> None:
        self.k, self.s = 0, 0.0

    def add(self, x: np.ndarray) -> None:
        self.add_sum(*_square_sum(x))

    def add_sum(self, s: float, k: int) -> None:
        if not s:
            return
        if self.s and self.k > k:
            s, k = math.ldexp(s, 2 * (k - self.k)), self.k
        elif self.s:
            self.s = math.ldexp(self.s, 2 * (self.k - k))
        self.k, self.s = k, self.s + s

    def root(self, below: _Squares | None = None) -> float:
        """sqrt(self), or sqrt(self / below), scaled back without an intermediate overflow."""
        value, k = math.sqrt(self.s), self.k
        if below is not None:
            value, k = value / math.sqrt(below.s), k - below.k
        try:
            return math.ldexp(value, k)
        except OverflowError:
            return math.inf


class _Chunk:
    """One chunk of the reference, x (its first flat index lo): rounded once per dtype and squared once,
    whatever the number of sides measured against it."""

    def __init__(self, x: np.ndarray, lo: int):
        self.x, self.lo = x, lo
        self._rounded: dict[str, np.ndarray] = {}

    def rounded_bits(self, name: str) -> np.ndarray:
        """x correctly rounded to dtype `name`, as its bit patterns."""
        if name not in self._rounded:
            self._rounded[name] = unsigned_view(round_float64(self.x, name))
        return self._rounded[name]

    @cached_property
    def squares(self) -> tuple[float, int]:
        return _square_sum(self.x)


class _SideError:
    """One side's error against exact, chunk after chunk (error_to_exact's measures)."""

    def __init__(self, name: str, size: int):
        self.name, self.size, self.layout = name, size, FloatLayout(name)
        self.finite = self.agree = 0
        self.top, self.ulp_sum = 0, 0.0
        self.top_at: int | None = None
        self.below_edges = [0] * len(_EDGES)  # elements with ulp < each edge
        self.error, self.norm = _Squares(), _Squares()

    def add(self, s: np.ndarray, chunk: _Chunk) -> tuple[np.ndarray, np.ndarray | None]:
        """The side's values s of one chunk of the reference. Returns the side widened to float64 and, where
        every element of s and the reference is finite, s - x (else None)."""
        layout, x = self.layout, chunk.x
        us, ur = unsigned_view(s), chunk.rounded_bits(self.name)
        mag_s, mag_r = us & layout.magnitude_mask, ur & layout.magnitude_mask
        fin_s, fin_r = mag_s < layout.inf_bits, mag_r < layout.inf_bits
        all_finite = bool(fin_s.all()) and bool(fin_r.all())
        if all_finite:  # nearly always: no element is picked out
            where, ulp = None, _ulp_bits(us, ur, layout)
        else:
            nans = (mag_s > layout.inf_bits) & (mag_r > layout.inf_bits)
            self.agree += int(np.count_nonzero(~fin_s & ~fin_r & (nans | (us == ur))))
            where = np.flatnonzero(fin_s & fin_r)
            ulp = _ulp_bits(us[where], ur[where], layout)
        self.finite += ulp.size
        if ulp.size:
            arg = int(np.argmax(ulp))
            if int(ulp[arg]) > self.top or self.top_at is None:
                self.top, self.top_at = int(ulp[arg]), chunk.lo + int(arg if where is None else where[arg])
            self.ulp_sum += float(ulp.sum(dtype=np.float64))
            # bucket i holds edge_i <= ulp < edge_i+1, as metrics' histogram
            self.below_edges = [n + int(np.count_nonzero(ulp < edge)) for n, edge in zip(self.below_edges, _EDGES)]
        wide = s.astype(np.float64)  # exact: every narrower float is a float64
        if all_finite:  # x finite too (it rounds to a finite value): both norms over every element
            difference = wide - x
            self.error.add(difference)
            self.norm.add_sum(*chunk.squares)
            return wide, difference
        both = np.isfinite(wide) & np.isfinite(x)
        with np.errstate(invalid="ignore", over="ignore"):
            self.error.add(np.where(both, wide - x, 0.0))
        self.norm.add(np.where(both, x, 0.0))
        return wide, None

    def result(self) -> ExactError:
        u, finite = UNIT_ROUNDOFF[self.name], self.finite
        counts = [*self.below_edges, finite]
        histogram = [counts[0]] + [high - low for low, high in zip(counts, counts[1:])]
        error_norm, exact_norm = self.error.root(), self.norm.root()
        normwise = self.error.root(self.norm) if exact_norm else error_norm
        return ExactError(
            dtype=self.name, elements=self.size, finite=finite, nonfinite_agree=self.agree,
            class_mismatch=self.size - finite - self.agree, max_ulp=self.top, max_ulp_flat_index=self.top_at,
            mean_ulp=self.ulp_sum / finite if finite else 0.0, ulp_histogram=dict(zip(ULP_BUCKETS, histogram)),
            unit_roundoff=u, error_norm=error_norm, exact_norm=exact_norm, normwise=normwise, normwise_u=normwise / u,
            normwise_absolute=not exact_norm)


class _Closeness:
    """Which of two sides is closer to exact, chunk after chunk."""

    def __init__(self, size: int):
        self.size, self.a_closer, self.b_closer, self.identical = size, 0, 0, 0

    def add(self, va: np.ndarray, vb: np.ndarray, x: np.ndarray, da: np.ndarray | None, db: np.ndarray | None) -> None:
        """va, vb: the sides widened to float64; da, db: their differences to x where all three are finite."""
        if da is not None and db is not None:
            da, db = np.abs(da), np.abs(db)
            self.a_closer += int(np.count_nonzero(da < db))
            self.b_closer += int(np.count_nonzero(db < da))
            self.identical += int(np.count_nonzero(va == vb))
            return
        da, db = _distance(va, x), _distance(vb, x)
        nan_a, nan_b = np.isnan(da), np.isnan(db)
        self.a_closer += int(np.count_nonzero((da < db) | (nan_b & ~nan_a)))
        self.b_closer += int(np.count_nonzero((db < da) | (nan_a & ~nan_b)))
        self.identical += int(np.count_nonzero((va == vb) | (np.isnan(va) & np.isnan(vb))))

    def result(self) -> Closeness:
        ties, n = self.size - self.a_closer - self.b_closer, max(self.size, 1)
        return Closeness(elements=self.size, a_closer=self.a_closer, b_closer=self.b_closer, ties=ties,
                         identical=self.identical, a_share=self.a_closer / n, b_share=self.b_closer / n, tie_share=ties / n)


def _distance(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(v - x)
    d[v == x] = 0.0  # Inf against the same Inf: inf - inf is NaN, but the side is exact there
    return d


def measure(sides: list[np.ndarray], exact: np.ndarray, closeness: bool = False) -> tuple[list[ExactError], Closeness | None]:
    """Each side's error to exact (error_to_exact) and, with `closeness` and two sides, which is closer
    (closer), in one pass over the elements: the reference is rounded once per dtype and squared once."""
    flats = [_flat(side, exact) for side in sides]
    ref = flats[0][1] if flats else np.ascontiguousarray(exact).reshape(-1)
    errors = [_SideError(name, flat.size) for flat, _, name in flats]
    pair = _Closeness(ref.size) if closeness and len(sides) == 2 else None
    for lo in range(0, ref.size, CHUNK):
        chunk = _Chunk(ref[lo:lo + CHUNK], lo)
        seen = [error.add(flat[lo:lo + CHUNK], chunk) for (flat, _, _), error in zip(flats, errors)]
        if pair is not None:
            (va, da), (vb, db) = seen
            pair.add(va, vb, chunk.x, da, db)
    return [error.result() for error in errors], pair.result() if pair else None


def error_to_exact(side: np.ndarray, exact: np.ndarray) -> ExactError:
    """ULP distance of `side` to the correctly rounded `exact`, and its normwise relative error (module docstring)."""
    return measure([side], exact)[0][0]


def closer(a: np.ndarray, b: np.ndarray, exact: np.ndarray) -> Closeness:
    """Per element, which of sides `a` and `b` is closer to `exact` (module docstring)."""
    closeness = measure([a, b], exact, closeness=True)[1]
    assert closeness is not None
    return closeness
