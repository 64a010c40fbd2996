"""Element-wise bit-level metrics of two arrays of the same dtype and size.

Everything is computed on unsigned-integer views, chunk by chunk: the only full pass is the
"which bits differ" scan; ULP distance, NaN/Inf classes and abs/rel error are then computed on the
differing elements only (equal elements contribute 0 to all of them). Chunks run on a thread pool:
numpy releases the GIL in these kernels.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from harness.dtypes import FLOAT_DTYPES, FloatLayout, dtype_name, unsigned_view

ULP_BUCKETS = ("0", "1", "2-3", "4-15", ">=16")
CHUNK_ELEMENTS = 1 << 20
_EDGES = (1, 2, 4, 16)  # lower edges of the ULP histogram buckets after "0"
WORST_K = 16


@dataclass
class WorstElement:
    flat_index: int
    ulp: int | None  # None for a NaN/Inf class mismatch
    a_bits: int
    b_bits: int


@dataclass
class ElementStats:
    """Metrics of one pair; all counts are over elements."""

    elements: int = 0
    differing: int = 0  # strict: bit patterns differ
    signed_zero_only: int = 0  # +0 vs -0
    nan_payload_only: int = 0  # both NaN, different payload/sign
    nan_mismatch: int = 0  # NaN on exactly one side
    inf_mismatch: int = 0  # Inf on at least one side, not NaN, not equal
    max_ulp: int = 0
    max_ulp_flat_index: int | None = None
    ulp_histogram: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ULP_BUCKETS, 0))
    max_abs: float = 0.0
    max_abs_flat_index: int | None = None
    max_rel: float = 0.0
    max_rel_flat_index: int | None = None
    worst: list[WorstElement] = field(default_factory=list)

    @property
    def bitwise_equal(self) -> bool:
        return self.differing == 0

    @property
    def canonical_equal(self) -> bool:
        """Equal once every NaN is one pattern (signed zeros still differ)."""
        return self.differing == self.nan_payload_only

    def merge(self, other: ElementStats) -> None:
        self.elements += other.elements
        self.differing += other.differing
        self.signed_zero_only += other.signed_zero_only
        self.nan_payload_only += other.nan_payload_only
        self.nan_mismatch += other.nan_mismatch
        self.inf_mismatch += other.inf_mismatch
        for bucket in ULP_BUCKETS:
            self.ulp_histogram[bucket] += other.ulp_histogram[bucket]
        for name in ("max_ulp", "max_abs", "max_rel"):
            if getattr(other, name) > getattr(self, name):
                setattr(self, name, getattr(other, name))
                setattr(self, f"{name}_flat_index", getattr(other, f"{name}_flat_index"))
        self.worst = _top_worst(self.worst + other.worst)


def _top_worst(items: list[WorstElement]) -> list[WorstElement]:
    # Class mismatches (ulp None) rank above any finite distance.
    key = lambda w: (w.ulp is not None, -(w.ulp or 0), w.flat_index)  # noqa: E731
    return sorted(items, key=key)[:WORST_K]


def _largest_first_occurrences(values: np.ndarray, k: int, at_least: dict[int, int]) -> np.ndarray:
    """Positions of the k largest values, ties broken by position (deterministic across chunkings).

    `at_least` maps thresholds to how many values reach them: the selection runs on the smallest
    subset known to hold k values, which is what keeps a chunk where everything differs cheap.
    """
    if values.size <= k:
        return np.arange(values.size)
    top = int(values.max())
    at_top = np.flatnonzero(values == top)
    if at_top.size >= k:
        return at_top[:k]
    edge = max((e for e, n in at_least.items() if n >= k and e <= top), default=0)
    subset = np.flatnonzero(values >= edge) if edge else np.arange(values.size)
    chosen = values[subset]
    threshold = np.partition(chosen, chosen.size - k)[chosen.size - k]
    above = np.flatnonzero(chosen > threshold)
    return subset[np.concatenate([above, np.flatnonzero(chosen == threshold)[: k - above.size]])]


def _ulp_bits(ua: np.ndarray, ub: np.ndarray, layout: FloatLayout) -> np.ndarray:
    """ULP distance of finite bit patterns, in their own unsigned width (no int64, no overflow).

    This is |ordered(a) - ordered(b)| with ordered(x) = +-magnitude: the magnitudes' difference for
    one sign, their sum across signs (each magnitude < 2**(w-1), so the sum fits). +0/-0 give 0.
    """
    mag_a, mag_b = ua & layout.magnitude_mask, ub & layout.magnitude_mask
    same_sign = ((ua ^ ub) & layout.sign_mask) == 0
    return np.where(same_sign, np.maximum(mag_a, mag_b) - np.minimum(mag_a, mag_b), mag_a + mag_b)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ULP distance in the arrays' own float dtype (no upcasting). NaN/Inf pairs are not meaningful."""
    layout = FloatLayout(dtype_name(a.dtype))
    return _ulp_bits(unsigned_view(a), unsigned_view(b), layout).astype(np.int64)


def _float_chunk_stats(ua: np.ndarray, ub: np.ndarray, offset: int, layout: FloatLayout,
                       dtype: np.dtype) -> ElementStats:
    stats = ElementStats(elements=ua.size)
    differ = ua != ub
    count = int(np.count_nonzero(differ))
    stats.differing = count
    if count == 0:
        stats.ulp_histogram["0"] = ua.size
        return stats
    where = np.flatnonzero(differ)
    da, db = ua[where], ub[where]
    mag_a, mag_b = da & layout.magnitude_mask, db & layout.magnitude_mask
    worst: list[WorstElement] = []
    # NaN/Inf and signed zeros are rare: classify only where they occur.
    if max(mag_a.max(), mag_b.max()) >= layout.inf_bits or np.any((mag_a | mag_b) == 0):
        nan_a, nan_b = mag_a > layout.inf_bits, mag_b > layout.inf_bits
        inf_a, inf_b = mag_a == layout.inf_bits, mag_b == layout.inf_bits
        nan_mismatch = nan_a ^ nan_b
        inf_mismatch = ~(nan_a | nan_b) & (inf_a | inf_b)
        signed_zero = (mag_a == 0) & (mag_b == 0)
        stats.nan_payload_only = int(np.count_nonzero(nan_a & nan_b))
        stats.nan_mismatch = int(np.count_nonzero(nan_mismatch))
        stats.inf_mismatch = int(np.count_nonzero(inf_mismatch))
        stats.signed_zero_only = int(np.count_nonzero(signed_zero))
        mismatch = np.flatnonzero(nan_mismatch | inf_mismatch)[:WORST_K]
        worst = [WorstElement(int(offset + where[i]), None, int(da[i]), int(db[i])) for i in mismatch]
        finite = ~(nan_a | nan_b | inf_a | inf_b | signed_zero)
        da, db, where = da[finite], db[finite], where[finite]

    ulp = _ulp_bits(da, db, layout)
    at_least = [int(np.count_nonzero(ulp >= edge)) for edge in _EDGES]
    counts = [ua.size - at_least[0] - stats.nan_mismatch - stats.inf_mismatch,
              at_least[0] - at_least[1], at_least[1] - at_least[2], at_least[2] - at_least[3], at_least[3]]
    stats.ulp_histogram = dict(zip(ULP_BUCKETS, counts))
    if ulp.size:
        arg = int(np.argmax(ulp))
        stats.max_ulp, stats.max_ulp_flat_index = int(ulp[arg]), int(offset + where[arg])
        top = _largest_first_occurrences(ulp, WORST_K, dict(zip(_EDGES, at_least)))
        worst += [WorstElement(int(offset + where[i]), int(ulp[i]), int(da[i]), int(db[i])) for i in top]
        # 16-bit floats: fp32 holds their values and (to 2**-24) their differences; wider ones: fp64
        wide = np.float32 if dtype.itemsize == 2 else np.float64
        va = da.view(dtype).astype(wide)
        abs_err = np.abs(va - db.view(dtype).astype(wide))
        arg = int(np.argmax(abs_err))
        stats.max_abs, stats.max_abs_flat_index = float(abs_err[arg]), int(offset + where[arg])
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_err = abs_err / np.abs(va)
        arg = int(np.argmax(rel_err))
        stats.max_rel, stats.max_rel_flat_index = float(rel_err[arg]), int(offset + where[arg])
    stats.worst = _top_worst(worst)
    return stats


def _exact_chunk_stats(ua: np.ndarray, ub: np.ndarray, offset: int) -> ElementStats:
    """Integer and bool tensors: equality only."""
    differ = int(np.count_nonzero(ua != ub))
    stats = ElementStats(elements=ua.size, differing=differ)
    stats.ulp_histogram["0"] = ua.size - differ
    return stats


def element_stats(a: np.ndarray, b: np.ndarray, threads: int | None = None) -> ElementStats:
    """Compare two arrays of one dtype and one element count, element by element in C order."""
    if a.dtype != b.dtype or a.size != b.size:
        raise ValueError("element_stats needs arrays of one dtype and size")
    name = dtype_name(a.dtype)
    ua, ub = unsigned_view(a).reshape(-1), unsigned_view(b).reshape(-1)
    layout = FloatLayout(name) if name in FLOAT_DTYPES else None
    starts = range(0, ua.size, CHUNK_ELEMENTS)

    def chunk(start: int) -> ElementStats:
        ca, cb = ua[start:start + CHUNK_ELEMENTS], ub[start:start + CHUNK_ELEMENTS]
        if layout is None:
            return _exact_chunk_stats(ca, cb, start)
        return _float_chunk_stats(ca, cb, start, layout, a.dtype)

    total = ElementStats()
    if len(starts) <= 1:
        parts = [chunk(s) for s in starts]
    else:
        with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
            parts = list(pool.map(chunk, starts))
    for part in parts:
        total.merge(part)
    return total
