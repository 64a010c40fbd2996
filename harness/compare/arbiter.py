"""The float64 reference as arbiter of a tensor pair: each side's error against the exact result, and which
side is closer, element by element (harness.compare.exact measures; this module decides what can be measured)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.compare.exact import Closeness, ExactError, measure
from harness.dtypes import FLOAT_DTYPES, dtype_name


@dataclass(frozen=True)
class ExactComparison:
    """One tensor of both sides against the reference. `missing`: why there is no arbiter (N/A), else None;
    a side's error is None where that side has no values to measure (the reason in `unmeasured`)."""

    sides: tuple[str, str]
    a: ExactError | None = None
    b: ExactError | None = None
    closeness: Closeness | None = None
    missing: str | None = None
    unmeasured: tuple[str | None, str | None] = (None, None)

    def error_of(self, side: str) -> ExactError | None:
        return self.a if side == self.sides[0] else self.b if side == self.sides[1] else None

    def why_unmeasured(self, side: str) -> str:
        if self.missing:
            return self.missing
        return (self.unmeasured[self.sides.index(side)] if side in self.sides else None) or NO_VALUES

    def to_json(self) -> dict:
        return {"sides": list(self.sides), "missing": self.missing,
                "a": self.a.to_json() if self.a else None, "b": self.b.to_json() if self.b else None,
                "closeness": self.closeness.to_json() if self.closeness else None,
                "unmeasured": list(self.unmeasured)}


# Why something is not measured, as codes (harness.reports.text words them); a reason from outside (a family's
# no_reference, a failed reference) is kept as it came.
NO_VALUES, NOT_FLOAT, OTHER_SHAPE, NOT_COMPUTED, NOT_GIVEN = "no-values", "not-float", "other-shape", "not-computed", "not-given"


def _unmeasurable(array: np.ndarray | None, exact: np.ndarray) -> str | None:
    if array is None:
        return NO_VALUES
    if dtype_name(array.dtype) not in FLOAT_DTYPES:
        return NOT_FLOAT
    if array.shape != exact.shape:
        return OTHER_SHAPE
    return None


def arbitrate(a: np.ndarray | None, b: np.ndarray | None, exact: np.ndarray | None, sides: tuple[str, str],
              missing: str | None = None, name: str = "", identical: bool = False) -> ExactComparison:
    """Both sides of one tensor against the reference's values of it (`exact`, or None with `missing` saying why).
    `identical`: a and b are known to hold the same bytes (equal digests): B's error is A's, every element a tie."""
    if missing:
        return ExactComparison(sides, missing=missing)
    if exact is None:
        return ExactComparison(sides, missing=NOT_COMPUTED)
    if dtype_name(exact.dtype) not in FLOAT_DTYPES:
        return ExactComparison(sides, missing=NOT_FLOAT)
    reference = exact.astype(np.float64, copy=False)
    why = (_unmeasurable(a, reference), _unmeasurable(b, reference))
    if identical and a is not None and why[0] is None:
        (error,), _ = measure([a], reference)
        n = error.elements
        ties = Closeness(elements=n, a_closer=0, b_closer=0, ties=n, identical=n, a_share=0.0, b_share=0.0,
                         tie_share=1.0 if n else 0.0)
        return ExactComparison(sides, error, error, ties, None, why)
    measurable = [side for side, reason in zip((a, b), why) if reason is None and side is not None]
    found, closeness = measure(measurable, reference, closeness=True)
    errors = iter(found)
    a_error, b_error = (next(errors) if reason is None and side is not None else None for side, reason in zip((a, b), why))
    return ExactComparison(sides, a_error, b_error, closeness, None, why)
