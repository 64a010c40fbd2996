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


class _Squares:
    """A sum of squares kept as s * 4**k: each chunk is scaled by the power of two above its largest magnitude
    (exact), so squares of tiny or huge float64 values neither underflow nor overflow."""

    def __init__(self) -> None:
        self.k, self.s = 0, 0.0

    def add(self, x: np.ndarray) -> None:
        top = float(np.max(np.abs(x), initial=0.0))
        if top == 0:
            return
        k = math.frexp(top)[1]
        # x / 2**k is exact; where the squares can neither overflow nor fall below the normal range (the usual
        # case) the scaling can wait: x @ x equals the scaled sum times 4**k up to its own rounding
        tiny = float(np.min(np.abs(x[x != 0]), initial=top))
        s = float(x @ x) * 0.25 ** k if 1e-140 < tiny and top < 1e140 else float(np.sum(np.square(np.ldexp(x, -k))))
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


def error_to_exact(side: np.ndarray, exact: np.ndarray) -> ExactError:
    """ULP distance of `side` to the correctly rounded `exact`, and its normwise relative error (module docstring)."""
    flat, ref, name = _flat(side, exact)
    layout = FloatLayout(name)
    finite = agree = 0
    top, top_at, ulp_sum = 0, None, 0.0
    histogram = [0] * len(ULP_BUCKETS)
    error, norm = _Squares(), _Squares()
    for lo in range(0, flat.size, CHUNK):
        s, x = flat[lo:lo + CHUNK], ref[lo:lo + CHUNK]
        us, ur = unsigned_view(s), unsigned_view(round_float64(x, name))
        mag_s, mag_r = us & layout.magnitude_mask, ur & layout.magnitude_mask
        fin_s, fin_r = mag_s < layout.inf_bits, mag_r < layout.inf_bits
        nans = (mag_s > layout.inf_bits) & (mag_r > layout.inf_bits)
        agree += int(np.count_nonzero(~fin_s & ~fin_r & (nans | (us == ur))))
        where = np.flatnonzero(fin_s & fin_r)
        ulp = _ulp_bits(us[where], ur[where], layout)
        finite += ulp.size
        if ulp.size:
            arg = int(np.argmax(ulp))
            if int(ulp[arg]) > top or top_at is None:
                top, top_at = int(ulp[arg]), lo + int(where[arg])
            ulp_sum += float(ulp.sum(dtype=np.float64))
            # bucket i holds edge_i <= ulp < edge_i+1 (as metrics does), counted in one pass
            counts = np.bincount(np.searchsorted(np.asarray(_EDGES, ulp.dtype), ulp, side="right"),
                                 minlength=len(ULP_BUCKETS))
            histogram = [h + int(c) for h, c in zip(histogram, counts)]
        wide = s.astype(np.float64)  # exact: every narrower float is a float64
        both = np.isfinite(wide) & np.isfinite(x)
        with np.errstate(invalid="ignore", over="ignore"):
            error.add(np.where(both, wide - x, 0.0))
        norm.add(np.where(both, x, 0.0))
    u = UNIT_ROUNDOFF[name]
    error_norm, exact_norm = error.root(), norm.root()
    normwise = error.root(norm) if exact_norm else error_norm
    return ExactError(
        dtype=name, elements=flat.size, finite=finite, nonfinite_agree=agree, class_mismatch=flat.size - finite - agree,
        max_ulp=top, max_ulp_flat_index=top_at, mean_ulp=ulp_sum / finite if finite else 0.0,
        ulp_histogram=dict(zip(ULP_BUCKETS, histogram)), unit_roundoff=u, error_norm=error_norm, exact_norm=exact_norm,
        normwise=normwise, normwise_u=normwise / u, normwise_absolute=not exact_norm)


def _distance(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(v - x)
    d[v == x] = 0.0  # Inf against the same Inf: inf - inf is NaN, but the side is exact there
    return d


def closer(a: np.ndarray, b: np.ndarray, exact: np.ndarray) -> Closeness:
    """Per element, which of sides `a` and `b` is closer to `exact` (module docstring)."""
    fa, ref, _ = _flat(a, exact)
    fb, _, _ = _flat(b, exact)
    a_closer = b_closer = identical = 0
    for lo in range(0, ref.size, CHUNK):
        x = ref[lo:lo + CHUNK]
        va, vb = fa[lo:lo + CHUNK].astype(np.float64), fb[lo:lo + CHUNK].astype(np.float64)
        da, db = _distance(va, x), _distance(vb, x)
        nan_a, nan_b = np.isnan(da), np.isnan(db)
        a_closer += int(np.count_nonzero((da < db) | (nan_b & ~nan_a)))
        b_closer += int(np.count_nonzero((db < da) | (nan_a & ~nan_b)))
        identical += int(np.count_nonzero((va == vb) | (np.isnan(va) & np.isnan(vb))))
    ties, n = ref.size - a_closer - b_closer, max(ref.size, 1)
    return Closeness(elements=ref.size, a_closer=a_closer, b_closer=b_closer, ties=ties, identical=identical,
                     a_share=a_closer / n, b_share=b_closer / n, tie_share=ties / n)
