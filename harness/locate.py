"""Where two tensors differ: a downsampled grid over the last two dimensions (leading dims flattened
into rows), with the count of differing elements and the max ULP in each cell."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.dtypes import FLOAT_DTYPES, FloatLayout, dtype_name, unsigned_view
from harness.metrics import _ulp_bits

MAX_CELLS = 64  # per axis


@dataclass
class MismatchMap:
    rows: int  # the tensor seen as [rows, cols]
    cols: int
    row_step: int  # elements per cell along each axis
    col_step: int
    counts: list[list[int]]  # differing elements per cell
    max_ulp: list[list[int]]  # max finite ULP per cell (NaN/Inf mismatches count, with no ULP)


def mismatch_map(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> MismatchMap:
    cols = shape[-1] if len(shape) >= 2 else (shape[0] if shape else 1)
    rows = int(np.prod(shape[:-1])) if len(shape) >= 2 else 1
    row_step, col_step = -(-rows // MAX_CELLS), -(-cols // MAX_CELLS)
    grid_rows, grid_cols = -(-rows // row_step), -(-cols // col_step)
    ua, ub = unsigned_view(a).reshape(-1), unsigned_view(b).reshape(-1)
    where = np.flatnonzero(ua != ub)
    cell = (where // cols // row_step) * grid_cols + (where % cols) // col_step
    counts = np.bincount(cell, minlength=grid_rows * grid_cols)
    max_ulp = np.zeros(grid_rows * grid_cols, dtype=np.int64)
    name = dtype_name(a.dtype)
    if name in FLOAT_DTYPES and where.size:
        layout = FloatLayout(name)
        da, db = ua[where], ub[where]
        finite = ((da & layout.magnitude_mask) < layout.inf_bits) & ((db & layout.magnitude_mask) < layout.inf_bits)
        np.maximum.at(max_ulp, cell[finite], _ulp_bits(da[finite], db[finite], layout).astype(np.int64))
    return MismatchMap(rows, cols, row_step, col_step,
                       counts.reshape(grid_rows, grid_cols).tolist(), max_ulp.reshape(grid_rows, grid_cols).tolist())
