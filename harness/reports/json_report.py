"""The full comparison as JSON: strict (no Infinity/NaN literals: non-finite floats are the strings
"inf", "-inf", "nan"), versioned, and one shape for one case or many:
{"format": "xfalign-report/1", "cases": [...]}."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from harness.compare import CaseComparison, TensorPair
from harness.atomic import write_text_atomic
from harness.reports.text import expectation_text, finite_or_text, verdict_text

FORMAT = "xfalign-report/1"
# Numbers that do not apply to a pair are null: ULP on integer/bool tensors, and distances when every
# difference is a NaN/Inf class mismatch (their counts are nan_mismatch and inf_mismatch).
_ULP_KEYS = ("max_ulp", "max_ulp_flat_index", "ulp_histogram")
_ERROR_KEYS = ("max_abs", "max_abs_flat_index", "max_rel", "max_rel_flat_index")


def _pair(pair: TensorPair) -> dict:
    stats = None
    if pair.stats is not None:
        stats = dataclasses.asdict(pair.stats) | {"bitwise_equal": pair.stats.bitwise_equal,
                                                  "canonical_equal": pair.stats.canonical_equal}
        if not pair.measured:
            stats |= dict.fromkeys(_ERROR_KEYS + (_ULP_KEYS if pair.exact else _ULP_KEYS[:2]))
    return {
        "name": pair.name,
        "expectation": expectation_text(pair),
        "exact": pair.exact,
        "holds": pair.holds,
        "bitwise": pair.bitwise,
        "a": pair.a and pair.a.to_json(),
        "b": pair.b and pair.b.to_json(),
        "findings": pair.findings,
        "note": pair.note,
        "axes": pair.axes,
        "stats": stats,
    }


def comparison_json(comparison: CaseComparison) -> dict:
    first = comparison.first_divergent
    return {
        "case": comparison.case_name,
        "status": comparison.status,  # "pass" | "fail" | "n/a"
        "passed": comparison.status == "pass",
        "reason": comparison.unavailable,  # why it is N/A, else null
        "verdict": verdict_text(comparison),
        "first_divergent": first and first.name,
        "sides": {"a": dataclasses.asdict(comparison.a), "b": dataclasses.asdict(comparison.b)},
        "inputs": {name: d.to_json() for name, d in comparison.inputs.items()},
        "tensors": [_pair(pair) for pair in comparison.pairs],
    }


def write_json(comparisons: list[CaseComparison], path: str | Path) -> Path:
    data = {"format": FORMAT, "cases": [comparison_json(c) for c in comparisons]}
    return write_text_atomic(path, json.dumps(finite_or_text(data), indent=1, allow_nan=False) + "\n")
