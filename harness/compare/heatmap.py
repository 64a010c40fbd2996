"""Where two tensors differ: a downsampled grid over the last two dimensions (leading dims flattened
into rows), with the count of differing elements and the max ULP in each cell.

The grid is filled during the comparison's one pass over the data (harness.compare.metrics.element_stats_and_map),
from the differing elements that pass finds anyway; this module holds its geometry and result.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CELLS = 64  # per axis


@dataclass
class MismatchMap:
    rows: int  # the tensor seen as [rows, cols]
    cols: int
    row_step: int  # elements per cell along each axis
    col_step: int
    counts: list[list[int]]  # differing elements per cell
    max_ulp: list[list[int]]  # max finite ULP per cell (NaN/Inf mismatches count, with no ULP)


@dataclass(frozen=True)
class Grid:
    """A tensor of `shape` seen as [rows, cols], cut into at most MAX_CELLS x MAX_CELLS cells."""

    rows: int
    cols: int
    row_step: int
    col_step: int

    @classmethod
    def of(cls, shape: tuple[int, ...]) -> Grid:
        cols = shape[-1] if len(shape) >= 2 else (shape[0] if shape else 1)
        rows = 1
        for n in shape[:-1] if len(shape) >= 2 else ():
            rows *= int(n)
        cols = int(cols)
        return cls(rows, cols, max(1, -(-rows // MAX_CELLS)), max(1, -(-cols // MAX_CELLS)))

    @property
    def grid_rows(self) -> int:
        return -(-self.rows // self.row_step)

    @property
    def grid_cols(self) -> int:
        return -(-self.cols // self.col_step)
