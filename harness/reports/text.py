"""The words of every result, in one place: the terminal, JSON, HTML reports, the gate and the pytest
plugin say what they say through these functions (plain text; each reporter escapes for its medium)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from harness.case import MaxUlp, describe_expectation

if TYPE_CHECKING:  # compare.py imports this module: types only
    from harness.compare import CaseComparison, TensorPair

STATUS_LABELS = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A"}
NOT_MEASURED = "-"  # a number that does not apply (no stats, an exact dtype, only NaN/Inf mismatches)


def status_label(status: str) -> str:
    return STATUS_LABELS[status]


def expectation_text(pair: TensorPair) -> str:
    """The expectation as it applies to this pair: max_ulp on an integer or bool tensor is equality."""
    if pair.exact and isinstance(pair.expectation, MaxUlp):
        return f"equality ({pair.a.dtype})"
    return describe_expectation(pair.expectation)


def ulp_text(pair: TensorPair) -> str:
    return str(pair.stats.max_ulp) if pair.measured else NOT_MEASURED


def error_text(value: float | None, digits: int = 3) -> str:
    return NOT_MEASURED if value is None else f"{value:.{digits}g}"


def abs_text(pair: TensorPair, digits: int = 3) -> str:
    return error_text(pair.stats.max_abs if pair.measured else None, digits)


def rel_text(pair: TensorPair, digits: int = 3) -> str:
    return error_text(pair.stats.max_rel if pair.measured else None, digits)


def classes_text(pair: TensorPair) -> str:
    """NaN and Inf mismatches, as "NaN/Inf" counts."""
    if pair.stats is None or pair.exact:
        return NOT_MEASURED
    return f"{pair.stats.nan_mismatch}/{pair.stats.inf_mismatch}"


def _first(index: int | None) -> str:
    return "" if index is None else f" (first at flat index {index})"


def difference_text(pair: TensorPair) -> str:
    """How two tensors differ, in one line."""
    if pair.findings:
        return "; ".join(pair.findings)
    s = pair.stats
    parts = [f"{s.differing:,} of {s.elements:,} elements differ"]
    if pair.exact:
        return parts[0]
    if pair.measured:
        where = f" (max at flat index {s.max_ulp_flat_index})" if s.max_ulp_flat_index is not None else ""
        parts += [f"max {s.max_ulp} ULP{where}", f"max abs {s.max_abs:.3g}"]
    if s.nan_mismatch or s.inf_mismatch:
        parts.append(f"{s.nan_mismatch} NaN and {s.inf_mismatch} Inf mismatches")
    if s.signed_zero_only:
        parts.append(f"{s.signed_zero_only} differ only in the sign of zero"
                     + _first(s.signed_zero_first_index))
    if s.nan_payload_only:
        parts.append(f"{s.nan_payload_only} differ only in NaN payload"
                     + _first(s.nan_payload_first_index))
    return ", ".join(parts)


def failure_text(pair: TensorPair) -> str:
    """Why an expectation does not hold, in one line."""
    return f"{pair.name}: expected {expectation_text(pair)}, but {difference_text(pair)}"


def not_available_text(reason: str) -> str:
    return f"not available here: {reason}"


def summary_text(comparison: CaseComparison) -> str:
    if comparison.status == "n/a":
        return not_available_text(comparison.unavailable)
    bitwise = sum(pair.bitwise for pair in comparison.pairs)
    return f"{len(comparison.pairs)} tensors, {bitwise} bitwise equal"


def verdict_text(comparison: CaseComparison) -> str:
    """The case's verdict after its label, e.g. "case: 3 tensors, 3 bitwise equal; every expectation holds"."""
    summary = f"{comparison.case_name}: {summary_text(comparison)}"
    if comparison.status == "pass":
        return f"{summary}; every expectation holds"
    if comparison.status == "fail":
        return f"{summary}; " + "; ".join(failure_text(pair) for pair in comparison.failing)
    return summary


def nondeterministic_text(side: str, tensor: str, distinct: int) -> str:
    return f"{tensor} is nondeterministic on side {side}: {distinct} different digests over the repeats"


def side_dumped_text(case_id: str, side: str, tensors: int, path) -> str:
    return f"{case_id}: side {side} dumped {tensors} tensors to {path}"


def side_unavailable_text(case_id: str, side: str, reason: str) -> str:
    return f"N/A {case_id}: side {side} is {not_available_text(reason)}"


def index_title(statuses: list[str]) -> str:
    """Heading of a report over several cases."""
    title = f"{statuses.count('pass')} of {len(statuses)} cases pass"
    if statuses.count("n/a"):
        title += f", {statuses.count('n/a')} N/A"
    return title


def finite_or_text(value):
    """JSON has no inf or NaN: non-finite floats become "inf", "-inf", "nan" (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: finite_or_text(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_text(item) for item in value]
    return value
