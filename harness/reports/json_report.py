"""The full comparison as JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from harness.case import describe_expectation
from harness.compare import CaseComparison, TensorPair
from harness.files import write_text_atomic


def _pair(pair: TensorPair) -> dict:
    stats = None
    if pair.stats is not None:
        stats = dataclasses.asdict(pair.stats) | {"bitwise_equal": pair.stats.bitwise_equal,
                                                  "canonical_equal": pair.stats.canonical_equal}
    return {
        "name": pair.name,
        "expectation": describe_expectation(pair.expectation),
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
        "passed": comparison.passed,
        "first_divergent": first and first.name,
        "sides": {"a": dataclasses.asdict(comparison.a), "b": dataclasses.asdict(comparison.b)},
        "inputs": {name: d.to_json() for name, d in comparison.inputs.items()},
        "tensors": [_pair(pair) for pair in comparison.pairs],
    }


def write_json(comparisons: list[CaseComparison], path: str | Path) -> Path:
    data = [comparison_json(c) for c in comparisons]
    return write_text_atomic(path, json.dumps(data[0] if len(data) == 1 else data, indent=1) + "\n")
