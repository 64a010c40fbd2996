"""Element-wise bit-level metrics of two arrays of the same dtype and size, and where they differ.

Everything is computed on unsigned-integer views, in one pass over the data, chunk by chunk on a
thread pool (numpy releases the GIL in these kernels; each thread reuses its own buffers). Per chunk
the "which bits differ" scan comes first, on 8-byte words (several elements at a time). Where few
elements differ, ULP distance, NaN/Inf classes, abs/rel error and the mismatch grid
(harness.compare.heatmap) are computed on the differing elements only, gathered (equal elements contribute 0
to all of them); where many differ, on whole cache-sized blocks, in place, with no gathering.
The same pass feeds the digest checks of both sides' bytes (harness.store.digest.StreamCheck: MD5, and XXH3-128
where recorded), chunk by chunk, as each chunk is read, where it runs on several threads: comparing a read
dump verifies it without a pass of its own. A pair of one chunk (one thread) leaves its checks unfed: MD5 is
one sequential stream per tensor, and the caller hashes such tensors together, in threads.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from harness.compare.heatmap import Grid, MismatchMap
from harness.dtypes import (
    FLOAT_DTYPES,
    NUMPY_DTYPES,
    FloatLayout,
    dtype_name,
    unsigned_view,
)
from harness.store.digest import StreamCheck

ULP_BUCKETS = ("0", "1", "2-3", "4-15", ">=16")
CHUNK_ELEMENTS = 1 << 21  # per task of the thread pool: the "which bits differ" scan, then the differing elements
DENSE_FRACTION = 16  # where more than 1/16 of the elements differ, compute on whole blocks, in place
DENSE_BLOCK = 1 << 18  # elements per such block: in cache, and numpy calls long enough for 2 threads to overlap
_SEARCH_BLOCK = 1 << 14
_PROBE = 1 << 12  # elements of a chunk's head that decide whether to try gathering (only a matter of speed)
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
    signed_zero_first_index: int | None = None  # first +0 vs -0 element
    nan_payload_first_index: int | None = None  # first element that differs only in NaN payload

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
        for name in ("signed_zero_first_index", "nan_payload_first_index"):
            indices = [i for i in (getattr(self, name), getattr(other, name)) if i is not None]
            setattr(self, name, min(indices, default=None))


def _top_worst(items: list[WorstElement]) -> list[WorstElement]:
    # Class mismatches (ulp None) rank above any finite distance.
    return sorted(items, key=lambda w: (w.ulp is not None, -(w.ulp or 0), w.flat_index))[:WORST_K]


def _first_equal(values: np.ndarray, value, k: int) -> np.ndarray:
    """Positions of the first k elements equal to `value`, searched block by block (no full pass
    when they come early)."""
    found, total = [], 0
    for start in range(0, values.size, _SEARCH_BLOCK):
        hits = np.flatnonzero(values[start:start + _SEARCH_BLOCK] == value)
        if hits.size:
            found.append(hits + start)
            total += hits.size
            if total >= k:
                break
    return np.concatenate(found)[:k] if found else np.empty(0, dtype=np.intp)


def _largest_first_occurrences(values: np.ndarray, k: int, at_least: dict[int, int], top: int) -> np.ndarray:
    """Positions of the k largest values among those >= 1, ties broken by position (deterministic
    across chunkings). `top` is the largest value.

    `at_least` maps thresholds (1 among them) to how many values reach them: the selection runs on
    the smallest subset known to hold k values, which is what keeps a chunk where everything differs
    cheap. Values of 0 (equal elements, when a block is computed whole) are never chosen.
    """
    if at_least[1] <= k:
        return np.flatnonzero(values >= 1) if at_least[1] < values.size else np.arange(values.size)
    at_top = _first_equal(values, top, k)
    if at_top.size >= k:
        return at_top
    edge = max(e for e, n in at_least.items() if n >= k and e <= top)
    subset = np.flatnonzero(values >= edge)
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


_BF16 = NUMPY_DTYPES["bfloat16"]


def _values(bits: np.ndarray, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """Values of float bit patterns, for abs/rel error: 16-bit floats in fp32 (which holds them and, to
    2**-24, their differences), wider ones in fp64. Into `out` where given (fp64 needs no copy)."""
    if dtype == _BF16:  # widen, then shift in place (a shift that casts as it goes is twice as slow)
        wide = bits.astype(np.uint32) if out is None else out.view(np.uint32)
        if out is not None:
            np.copyto(wide, bits)
        return np.left_shift(wide, 16, out=wide).view(np.float32)
    if dtype.itemsize == 8:
        return bits.view(dtype)
    if out is None:
        return bits.view(dtype).astype(np.float32 if dtype.itemsize == 2 else np.float64)
    np.copyto(out, bits.view(dtype))
    return out


@dataclass(frozen=True)
class _Span:
    """A chunk (or a block of one): flat elements [start, stop) of the tensor seen as [rows, cols]
    (harness.compare.heatmap.Grid), which are `nrows` rows of `width` elements from (row, col); and the block of
    grid cells it touches."""

    start: int
    stop: int
    row: int
    col: int
    nrows: int
    width: int
    cell_row: int
    cell_col: int
    cell_rows: int
    cell_cols: int


def _span(grid: Grid, row: int, col: int, nrows: int, width: int) -> _Span:
    start = row * grid.cols + col
    cell_row, cell_col = row // grid.row_step, col // grid.col_step
    return _Span(start, start + nrows * width, row, col, nrows, width, cell_row, cell_col,
                 (row + nrows - 1) // grid.row_step - cell_row + 1, (col + width - 1) // grid.col_step - cell_col + 1)


def _split(span: _Span, grid: Grid, size: int) -> list[_Span]:
    """`span` in pieces of at most `size` elements: whole rows (several to a piece), or pieces of a row
    where a row is longer."""
    if span.width <= size:
        step = size // span.width
        return [_span(grid, span.row + r, span.col, min(step, span.nrows - r), span.width) for r in range(0, span.nrows, step)]
    return [_span(grid, span.row + r, span.col + c, 1, min(size, span.width - c))
            for r in range(span.nrows) for c in range(0, span.width, size)]


@dataclass
class _Part:
    """A span's share of the mismatch grid: its block of cells."""

    span: _Span
    counts: np.ndarray  # int64 [cell_rows, cell_cols]
    max_ulp: np.ndarray  # uint64


def _floor_divide(x: np.ndarray, d: int) -> np.ndarray:
    """x // d for x >= 0, in place; a shift where d is a power of two (integer division is slow)."""
    return np.right_shift(x, d.bit_length() - 1, out=x) if d & (d - 1) == 0 else np.floor_divide(x, d, out=x)


def _cells(where: np.ndarray, span: _Span, grid: Grid) -> np.ndarray:
    """Cell (in the span's block of cells, row-major) of each position of the span."""
    col = where + span.start
    row = _floor_divide(col.copy(), grid.cols)
    col -= row * grid.cols
    _floor_divide(row, grid.row_step)
    row *= span.cell_cols
    row += _floor_divide(col, grid.col_step)
    row -= span.cell_row * span.cell_cols + span.cell_col
    return row


def _sparse_part(where: np.ndarray, where_finite: np.ndarray | None, ulp: np.ndarray | None, span: _Span,
                 grid: Grid) -> _Part:
    """Grid block from the positions of the differing elements (and the ULP of the finite ones)."""
    size = span.cell_rows * span.cell_cols
    cells = _cells(where, span, grid)
    counts = np.bincount(cells, minlength=size)
    max_ulp = np.zeros(size, dtype=np.uint64)  # fp64 distances reach 2**64 - 2
    if ulp is not None and ulp.size:
        assert where_finite is not None  # ULPs come with the positions of the finite elements they are of
        finite_cells = cells if where_finite is where else _cells(where_finite, span, grid)
        np.maximum.at(max_ulp, finite_cells, ulp.astype(np.uint64))
    shape = (span.cell_rows, span.cell_cols)
    return _Part(span, counts.astype(np.int64, copy=False).reshape(shape), max_ulp.reshape(shape))


def _reduce_cells(ufunc: np.ufunc, x: np.ndarray, axis: int, first: int, step: int, dtype=None) -> np.ndarray:
    """`x` reduced along `axis` (0 or 1) over grid cells of `step` elements, `x` starting `first`
    elements into the tensor along that axis: a partial cell at each end, whole cells between them
    reduced through a reshape (reduceat is slow on many short segments)."""
    n = x.shape[axis]
    head = min(n, -first % step)
    whole = (n - head) // step
    cut = head + whole * step
    at = (lambda lo, hi: x[lo:hi]) if axis == 0 else (lambda lo, hi: x[:, lo:hi])
    pieces = [ufunc.reduce(at(lo, hi), axis=axis, dtype=dtype, keepdims=True) for lo, hi in ((0, head), (cut, n)) if hi > lo]
    if whole:
        body = at(head, cut)
        body = body.reshape(whole, step, -1) if axis == 0 else body.reshape(body.shape[0], whole, step)
        pieces.insert(1 if head else 0, ufunc.reduce(body, axis=axis + 1, dtype=dtype))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=axis)


def _dense_part(differ: np.ndarray, ulp: np.ndarray | None, span: _Span, grid: Grid) -> _Part:
    """Grid block from a whole span: the differ mask and the ULP of every element (0 where equal).
    Rows are reduced first (cheap, and it leaves less to reduce along the columns)."""
    counts = differ.reshape(span.nrows, span.width).view(np.uint8)
    # narrow accumulators are the fast ones: a sum over rows stays under min(row_step, nrows), one over a
    # cell under the elements of a chunk
    if grid.row_step > 1:
        most = min(grid.row_step, span.nrows)
        counts = _reduce_cells(np.add, counts, 0, span.row, grid.row_step,
                               np.uint8 if most < 1 << 8 else np.uint16 if most < 1 << 16 else np.uint32)
    if grid.col_step > 1:
        counts = _reduce_cells(np.add, counts, 1, span.col, grid.col_step, np.uint32)
    counts = counts.astype(np.int64)  # a copy: the chunk's buffers are reused
    if ulp is None:
        return _Part(span, counts, np.zeros(counts.shape, dtype=np.uint64))
    max_ulp = ulp.reshape(span.nrows, span.width)
    if grid.row_step > 1:
        max_ulp = _reduce_cells(np.maximum, max_ulp, 0, span.row, grid.row_step)
    if grid.col_step > 1:
        max_ulp = _reduce_cells(np.maximum, max_ulp, 1, span.col, grid.col_step)
    return _Part(span, counts, max_ulp.astype(np.uint64))


class _Workspace:
    """One thread's buffers, reused from chunk to chunk: the differ mask of a chunk, and those of a dense block."""

    def __init__(self, length: int, uint: type, wide: type | None):
        self.uint, self.wide = uint, wide
        self.differ = np.empty(length, dtype=np.bool_)
        self.words = np.empty(length, dtype=np.bool_)  # the differ mask of 8-byte words
        # 16-bit elements: twice the elements for the same bytes (fewer numpy calls, less GIL contention)
        self.block = min(length, DENSE_BLOCK * (2 if np.dtype(uint).itemsize == 2 else 1))
        self._dense: tuple | None = None

    def dense(self, n: int) -> tuple:
        """Four unsigned, one bool and two wide-float buffers of n <= DENSE_BLOCK elements."""
        if self._dense is None:
            self._dense = (*(np.empty(self.block, dtype=self.uint) for _ in range(4)), np.empty(self.block, dtype=np.bool_),
                           *(np.empty(self.block, dtype=self.wide) for _ in range(2)))
        return tuple(buffer[:n] for buffer in self._dense)


def _histogram(stats: ElementStats, at_least: list[int], classes: int) -> None:
    counts = [stats.elements - at_least[0] - classes,
              at_least[0] - at_least[1], at_least[1] - at_least[2], at_least[2] - at_least[3], at_least[3]]
    stats.ulp_histogram = dict(zip(ULP_BUCKETS, counts))


def _float_sparse(ca: np.ndarray, cb: np.ndarray, where: np.ndarray, stats: ElementStats, span: _Span,
                  layout: FloatLayout, dtype: np.dtype, grid: Grid | None,
                  gathered: tuple[np.ndarray, np.ndarray] | None = None) -> _Part | None:
    """Metrics from the differing elements only (`where`; their bits `gathered` where already at hand)."""
    offset, differing = span.start, where
    da, db = (ca[where], cb[where]) if gathered is None else gathered
    mag_a, mag_b = da & layout.magnitude_mask, db & layout.magnitude_mask
    larger = np.maximum(mag_a, mag_b)
    worst: list[WorstElement] = []
    # NaN/Inf and signed zeros are rare: classify only where they occur.
    if larger.max() >= layout.inf_bits or larger.min() == 0:
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
        # ±0 and NaN-payload-only elements: 0 ULP, listed after every finite difference where there is room
        for name, only in (("signed_zero_first_index", signed_zero), ("nan_payload_first_index", nan_a & nan_b)):
            first = np.flatnonzero(only)[:WORST_K]
            if first.size:
                setattr(stats, name, int(offset + where[first[0]]))
                worst += [WorstElement(int(offset + where[i]), 0, int(da[i]), int(db[i])) for i in first]
        finite = ~(nan_a | nan_b | inf_a | inf_b | signed_zero)
        da, db, where, mag_a, mag_b, larger = da[finite], db[finite], where[finite], mag_a[finite], mag_b[finite], larger[finite]

    # ULP distance (as _ulp_bits): >= 1 here (finite, differing, not +0 vs -0)
    ulp = np.subtract(larger, np.minimum(mag_a, mag_b), out=larger)
    signs = da ^ db
    if signs.size and signs.max() >= layout.sign_mask:  # opposite signs (rare): the magnitudes' sum
        crossing = signs >= layout.sign_mask
        ulp[crossing] = mag_a[crossing] + mag_b[crossing]
    at_least = [ulp.size] + [int(np.count_nonzero(ulp >= edge)) for edge in _EDGES[1:]]
    _histogram(stats, at_least, stats.nan_mismatch + stats.inf_mismatch)
    if ulp.size:
        arg = int(np.argmax(ulp))
        stats.max_ulp, stats.max_ulp_flat_index = int(ulp[arg]), int(offset + where[arg])
        top = _largest_first_occurrences(ulp, WORST_K, dict(zip(_EDGES, at_least)), stats.max_ulp)
        worst += [WorstElement(int(offset + where[i]), int(ulp[i]), int(da[i]), int(db[i])) for i in top]
        va = _values(da, dtype)
        with np.errstate(over="ignore"):
            abs_err = np.abs(va - _values(db, dtype))
        arg = int(np.argmax(abs_err))
        stats.max_abs, stats.max_abs_flat_index = float(abs_err[arg]), int(offset + where[arg])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # |a| tiny or 0: rel error inf
            rel_err = abs_err / np.abs(va)
        arg = int(np.argmax(rel_err))
        stats.max_rel, stats.max_rel_flat_index = float(rel_err[arg]), int(offset + where[arg])
    stats.worst = _top_worst(worst)
    return None if grid is None else _sparse_part(differing, where, ulp, span, grid)


def _float_dense(ca: np.ndarray, cb: np.ndarray, differ: np.ndarray, stats: ElementStats, span: _Span,
                 layout: FloatLayout, dtype: np.dtype, grid: Grid | None, work: _Workspace) -> tuple[_Part | None] | None:
    """Metrics on a whole block, in the workspace's buffers (no gathering): for blocks where many
    elements differ. Equal elements give ULP 0 and abs error 0, so they change no max. Returns None,
    having changed nothing, when the block holds a NaN or Inf: those are classified on gathered elements."""
    n = ca.size
    mag_a, mag_b, ulp, other, flags, wide_a, wide_b = work.dense(n)
    np.bitwise_and(ca, layout.magnitude_mask, out=mag_a)
    np.bitwise_and(cb, layout.magnitude_mask, out=mag_b)
    if max(int(mag_a.max()), int(mag_b.max())) >= layout.inf_bits:
        return None
    # ULP distance (as _ulp_bits): |mag_a - mag_b| for one sign, mag_a + mag_b across signs (rare). The
    # magnitudes are < 2**(w-1), so their wrapped difference seen signed is exact, and its absolute value too.
    signed = ulp.view(np.dtype(f"i{ulp.itemsize}"))
    np.subtract(mag_a, mag_b, out=ulp)
    np.absolute(signed, out=signed)
    signs = np.bitwise_xor(ca, cb, out=other)
    crossing = bool(signs.max() >= layout.sign_mask)
    if crossing:
        np.add(mag_a, mag_b, out=ulp, where=np.greater_equal(signs, layout.sign_mask, out=flags))
    # with no sign crossing, the differing elements are exactly those a nonzero distance apart (+0/-0 is a crossing)
    nonzero = int(np.count_nonzero(ulp)) if crossing else stats.differing
    top = int(ulp.max()) if nonzero else 0
    arg = int(_first_equal(ulp, top, 1)[0]) if nonzero else 0  # the first maximum, as argmax
    # buckets above the largest distance are empty: no pass for them
    at_least = [nonzero] + [int(np.count_nonzero(np.greater_equal(ulp, edge, out=flags))) if edge <= top else 0
                            for edge in _EDGES[1:]]
    stats.signed_zero_only = stats.differing - at_least[0]  # finite, differing, 0 ULP apart: +0 vs -0
    _histogram(stats, at_least, 0)
    if stats.signed_zero_only:
        zeros = np.flatnonzero(np.logical_and(differ, np.equal(ulp, 0, out=flags), out=flags))[:WORST_K]
        stats.signed_zero_first_index = span.start + int(zeros[0])
        stats.worst = [WorstElement(span.start + int(i), 0, int(ca[i]), int(cb[i])) for i in zeros]
    if at_least[0]:
        stats.max_ulp, stats.max_ulp_flat_index = top, span.start + arg
        largest = _largest_first_occurrences(ulp, WORST_K, dict(zip(_EDGES, at_least)), stats.max_ulp)
        stats.worst = _top_worst(stats.worst + [WorstElement(span.start + int(i), int(ulp[i]), int(ca[i]), int(cb[i]))
                                                for i in largest])
        if dtype.itemsize != 4 or not _abs_rel_fp32(ca, cb, stats, span.start, wide_a, wide_b, flags, mag_a):
            _abs_rel_wide(ca, cb, dtype, stats, span.start, wide_a, wide_b, flags,
                          None if crossing else (mag_a, mag_b))
    return (None if grid is None else _dense_part(differ, ulp, span, grid),)


def _abs_rel_wide(ca: np.ndarray, cb: np.ndarray, dtype: np.dtype, stats: ElementStats, start: int,
                  wide_a: np.ndarray, wide_b: np.ndarray, flags: np.ndarray,
                  mags: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Max abs and rel error of a whole block (no NaN/Inf in it), in the wide float (_values).
    `mags`: the magnitudes' bits, where no element pair crosses signs: then |a - b| is the magnitudes'
    difference, rounding being symmetric, and |a| needs no pass of its own."""
    if mags is not None and dtype == _BF16 and ca.size % 2 == 0:
        _abs_rel_bf16_pairs(mags[0], mags[1], stats, start, wide_a, wide_b, flags)
        return
    va = _values(ca if mags is None else mags[0], dtype, wide_a)
    vb = _values(cb if mags is None else mags[1], dtype, wide_b)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        abs_err = np.absolute(np.subtract(va, vb, out=wide_b), out=wide_b)
        arg = int(np.argmax(abs_err))
        stats.max_abs, stats.max_abs_flat_index = float(abs_err[arg]), start + arg
        rel_err = np.divide(abs_err, va if mags is not None else np.absolute(va, out=wide_a), out=wide_b)
    arg = int(np.argmax(rel_err))  # the first maximum, unless there is a NaN (0/0: a and b both zero)
    top_rel = float(rel_err[arg])
    if top_rel != top_rel:
        top_rel = float(np.fmax.reduce(rel_err))
        arg = int(np.argmax(np.equal(rel_err, top_rel, out=flags)))
    if top_rel > 0:
        stats.max_rel, stats.max_rel_flat_index = top_rel, start + arg


def _first_max(x: np.ndarray, flags: np.ndarray) -> tuple[float, int]:
    """The largest value of `x` ignoring NaN, and the first position holding it (NaN, 0 where all are NaN)."""
    arg = int(np.argmax(x))
    top = float(x[arg])
    if top != top:
        top = float(np.fmax.reduce(x))
        arg = int(np.argmax(np.equal(x, top, out=flags[:x.size])))
    return top, arg


def _first_max_pairs(x: np.ndarray, half: int, flags: np.ndarray) -> tuple[float, int]:
    """_first_max of a block whose even elements are x[:half] and odd ones x[half:], in block positions."""
    top_even, arg_even = _first_max(x[:half], flags)
    top_odd, arg_odd = _first_max(x[half:], flags)
    candidates = [(top, pos) for top, pos in ((top_even, 2 * arg_even), (top_odd, 2 * arg_odd + 1)) if top == top]
    if not candidates:
        return math.nan, 0
    top = max(c[0] for c in candidates)
    return top, min(pos for value, pos in candidates if value == top)


def _abs_rel_bf16_pairs(mag_a: np.ndarray, mag_b: np.ndarray, stats: ElementStats, start: int,
                        wide_a: np.ndarray, wide_b: np.ndarray, flags: np.ndarray) -> None:
    """_abs_rel_wide for bf16 magnitudes (no sign crossing) of an even count: each pair of elements read as
    one 32-bit word gives both fp32 values in one operation each (the odd element: the word's high half; the
    even one: the word shifted), instead of a widening copy and a shift over every element. The values come
    out in the order [even elements, odd elements]; the positions of the maxima are mapped back."""
    n = mag_a.size
    half = n // 2
    for mag, wide in ((mag_a, wide_a), (mag_b, wide_b)):
        words, bits = mag.view(np.uint32), wide[:n].view(np.uint32)
        np.left_shift(words, 16, out=bits[:half])
        np.bitwise_and(words, np.uint32(0xFFFF0000), out=bits[half:])
    va, vb = wide_a[:n], wide_b[:n]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        abs_err = np.absolute(np.subtract(va, vb, out=vb), out=vb)
        top, arg = _first_max_pairs(abs_err, half, flags)
        stats.max_abs, stats.max_abs_flat_index = top, start + arg
        rel_err = np.divide(abs_err, va, out=vb)
    top_rel, arg = _first_max_pairs(rel_err, half, flags)
    if top_rel > 0:
        stats.max_rel, stats.max_rel_flat_index = top_rel, start + arg


_REL_SLACK = 1 - 2.0 ** -20  # fp32's rel error is within about 2**-23 of fp64's


def _abs_rel_fp32(ca: np.ndarray, cb: np.ndarray, stats: ElementStats, start: int, wide_a: np.ndarray,
                  wide_b: np.ndarray, flags: np.ndarray, mag_a: np.ndarray) -> bool:
    """_abs_rel_wide for fp32 at half the cost: the maxima are found in fp32, then the few elements
    that can hold them are computed in fp64, which decides (the same numbers and indices as all in
    fp64). Rounding is monotone, so every element at the fp64 max of |a-b| has the fp32 max; |a-b|/|a|
    rounds twice, so the candidates are those within 2**-20 of the fp32 max. False, having set
    nothing, where fp32 over- or underflows near a max: then fp64 it is, whole."""
    n = ca.size
    va, vb = ca.view(np.float32), cb.view(np.float32)
    diff, rel = wide_a.view(np.float32)[:n], wide_b.view(np.float32)[:n]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        top = diff.dtype.type(np.absolute(np.subtract(va, vb, out=diff), out=diff).max())
        top_rel = float(np.fmax.reduce(np.divide(diff, mag_a.view(np.float32), out=rel)))  # NaN: 0/0, equal
    if not (np.isfinite(top) and np.isfinite(top_rel) and top_rel >= 2.0 ** -100):
        return False

    def exact(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = va[at].astype(np.float64)
        return a, np.abs(a - vb[at].astype(np.float64))

    at = np.flatnonzero(np.equal(diff, top, out=flags))
    abs_err = exact(at)[1]
    arg = int(np.argmax(abs_err))
    stats.max_abs, stats.max_abs_flat_index = float(abs_err[arg]), start + int(at[arg])
    at = np.flatnonzero(np.greater_equal(rel, top_rel * _REL_SLACK, out=flags))
    a, abs_err = exact(at)
    rel_err = abs_err / np.abs(a)
    arg = int(np.argmax(rel_err))
    stats.max_rel, stats.max_rel_flat_index = float(rel_err[arg]), start + int(at[arg])
    return True


def _block(ca: np.ndarray, cb: np.ndarray, differ: np.ndarray | None, count: int, span: _Span, layout: FloatLayout | None,
           dtype: np.dtype, grid: Grid | None, work: _Workspace, where: np.ndarray | None = None,
           gathered: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[ElementStats, list[_Part]]:
    """Metrics of the elements of `span`: `count` of them differ, as the mask `differ` says, or the
    positions `where` with their bits `gathered` (given when few differ; then there is no mask)."""
    n = ca.size
    stats = ElementStats(elements=n, differing=count)
    if count == 0:
        stats.ulp_histogram["0"] = n
        return stats, []
    dense = differ if differ is not None and count * DENSE_FRACTION > n else None  # the mask, where many differ

    def positions() -> np.ndarray:
        if where is not None:
            return where
        assert differ is not None  # the caller gives the mask or the positions
        return np.flatnonzero(differ)

    if layout is None:  # integers and bools: equality only
        stats.ulp_histogram["0"] = n - count
        if grid is None:
            return stats, []
        return stats, [_dense_part(dense, None, span, grid) if dense is not None
                       else _sparse_part(positions(), None, None, span, grid)]
    if dense is not None and n <= work.block:
        done = _float_dense(ca, cb, dense, stats, span, layout, dtype, grid, work)
        if done is not None:
            return stats, [part for part in done if part is not None]
    part = _float_sparse(ca, cb, positions(), stats, span, layout, dtype, grid, gathered)
    return stats, [] if part is None else [part]


def _few_differing(ca: np.ndarray, cb: np.ndarray,
                   work: _Workspace) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None:
    """Positions of the differing elements and their bits on both sides, found by comparing 8-byte
    words (several elements at once), then the elements of the differing words only; None when too
    many differ for that to pay."""
    lanes = 8 // ca.itemsize
    whole = ca.size - ca.size % lanes
    wa, wb = ca[:whole].view(np.uint64), cb[:whole].view(np.uint64)
    words = np.not_equal(wa, wb, out=work.words[:wa.size])
    if int(np.count_nonzero(words)) * lanes * DENSE_FRACTION > ca.size:
        return None
    hits = np.flatnonzero(words)
    ga, gb = wa[hits].view(ca.dtype), wb[hits].view(ca.dtype)  # the differing words' elements
    at = np.flatnonzero(ga != gb)
    shift = lanes.bit_length() - 1
    where, da, db = (hits[at >> shift] << shift) | (at & (lanes - 1)), ga[at], gb[at]
    if whole < ca.size:
        tail = whole + np.flatnonzero(ca[whole:] != cb[whole:])
        where, da, db = np.concatenate([where, tail]), np.concatenate([da, ca[tail]]), np.concatenate([db, cb[tail]])
    return where, (da, db)


def _chunk(ua: np.ndarray, ub: np.ndarray, span: _Span, layout: FloatLayout | None, dtype: np.dtype,
           grid: Grid | None, shape_grid: Grid, work: _Workspace) -> tuple[ElementStats, list[_Part]]:
    """One task: the "which bits differ" scan over the chunk, then metrics from the differing elements
    (gathered where few differ; in place, block by block, where many do)."""
    ca, cb = ua[span.start:span.stop], ub[span.start:span.stop]
    n = ca.size
    # a probe of the chunk's head: where most of it differs, the gathering scan would not pay
    probe = min(n, _PROBE)
    likely_dense = n >= 4 * probe and int(np.count_nonzero(ca[:probe] != cb[:probe])) * 4 > probe
    few = None if likely_dense else _few_differing(ca, cb, work)
    if few is not None:
        return _block(ca, cb, None, few[0].size, span, layout, dtype, grid, work, *few)
    differ = np.not_equal(ca, cb, out=work.differ[:n])
    count = int(np.count_nonzero(differ))
    if count * DENSE_FRACTION <= n or n <= work.block or layout is None:
        return _block(ca, cb, differ, count, span, layout, dtype, grid, work)
    total, parts = ElementStats(), []
    for block in _split(span, shape_grid, work.block):
        lo, hi = block.start - span.start, block.stop - span.start
        differing = hi - lo if count == n else int(np.count_nonzero(differ[lo:hi]))  # all differ: no count needed
        stats, found = _block(ca[lo:hi], cb[lo:hi], differ[lo:hi], differing, block,
                              layout, dtype, grid, work)
        total.merge(stats)
        parts += found
    return total, parts


def _compare(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...] | None, threads: int | None,
             checks: tuple[StreamCheck | None, ...] = ()) -> tuple[ElementStats, MismatchMap | None]:
    if a.dtype != b.dtype or a.size != b.size:
        raise ValueError("element_stats needs arrays of one dtype and size")
    if shape is not None and math.prod(shape) != a.size:
        raise ValueError(f"shape {list(shape)} does not hold {a.size} elements")
    if a.size == 0:
        return ElementStats(), None
    name = dtype_name(a.dtype)
    ua, ub = unsigned_view(a).reshape(-1), unsigned_view(b).reshape(-1)
    layout = FloatLayout(name) if name in FLOAT_DTYPES else None
    grid = Grid.of(tuple(shape)) if shape is not None else None
    shape_grid = grid or Grid.of((ua.size,))  # chunks follow rows (or are flat, without a map)
    spans = _split(_span(shape_grid, 0, 0, shape_grid.rows, shape_grid.cols), shape_grid, CHUNK_ELEMENTS)
    wide = (np.float32 if a.itemsize == 2 else np.float64) if layout else None
    length = max(span.stop - span.start for span in spans)
    local = threading.local()

    threads = threads or os.cpu_count() or 1
    # A pass of one chunk runs on this thread alone: feeding it the checks would hash (MD5, one sequential
    # stream per tensor) on one core. They are left to the caller, which hashes the tensors the pass did not
    # feed together, in threads (harness.compare.case._settle).
    feeding = [check for check in checks if check is not None] if len(spans) > 1 or threads == 1 else []

    def chunk(span: _Span) -> tuple[ElementStats, list[_Part]]:
        work = getattr(local, "work", None)
        if work is None:
            work = local.work = _Workspace(length, ua.dtype.type, wide)
        found = _chunk(ua, ub, span, layout, a.dtype, grid, shape_grid, work)
        for check in feeding:  # the digests of the bytes just read, while they are in cache
            check.advance(span.stop)
        return found

    if len(spans) <= 1 or threads == 1:
        results = [chunk(span) for span in spans]
    else:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(chunk, spans))
    total = ElementStats()
    for stats, _ in results:
        total.merge(stats)
    if grid is None or total.differing == 0:
        return total, None
    counts = np.zeros((grid.grid_rows, grid.grid_cols), dtype=np.int64)
    max_ulp = np.zeros(counts.shape, dtype=np.uint64)
    for _, parts in results:
        for part in parts:
            s = part.span
            cells = (slice(s.cell_row, s.cell_row + s.cell_rows), slice(s.cell_col, s.cell_col + s.cell_cols))
            counts[cells] += part.counts
            np.maximum(max_ulp[cells], part.max_ulp, out=max_ulp[cells])
    return total, MismatchMap(grid.rows, grid.cols, grid.row_step, grid.col_step, counts.tolist(), max_ulp.tolist())


def element_stats(a: np.ndarray, b: np.ndarray, threads: int | None = None) -> ElementStats:
    """Compare two arrays of one dtype and one element count, element by element in C order."""
    return _compare(a, b, None, threads)[0]


def element_stats_and_map(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...], threads: int | None = None,
                          checks: tuple[StreamCheck | None, ...] = ()) -> tuple[ElementStats, MismatchMap | None]:
    """element_stats, and where the elements differ with the arrays seen in `shape` (a grid of cells
    over its last two dimensions), from the same one pass over the data. The map is None when
    nothing differs. `checks`: digest checks of `a`'s and `b`'s bytes (harness.store.digest.StreamCheck),
    fed chunk by chunk by the same pass where it runs on several threads (a pass of one chunk leaves them
    unfed: see the module's note); their verdicts are read with `matches()` afterwards."""
    return _compare(a, b, tuple(shape), threads, checks)
