"""The one result type: what a comparison, an expectation or the gate found, as data.

Terminal, JSON, HTML and the gate all carry `Finding`s; only harness.reports.text turns one into words.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

# What can be found. From a pair: "missing" (on one side), "dtype", "shape", "float-values",
# "exact-values", "digest" (digests differ: no values to measure, or values that are not the bytes
# recorded); from an expectation: "not-applicable" (e.g. max_ulp on bool values), "needs-values" (a
# tolerance on digests that differ while a side kept no values), "exact-error" (a side farther from the
# float64 reference than its bound), "no-worse-than" (a side farther from it than the other side allows),
# "no-reference" (a bound against the reference where nothing could be measured); from the gate:
# "input", "generator" (the golden's inputs were made by another version of the input generator),
# "nondeterministic", "no-golden", "environment" (a fingerprint field changed since the golden).
KINDS = ("missing", "dtype", "shape", "float-values", "exact-values", "digest", "not-applicable", "needs-values",
         "exact-error", "no-worse-than", "no-reference",
         "input", "generator", "nondeterministic", "no-golden", "environment")
PAIR_KINDS = KINDS[:11]  # what pairs and expectations find about one tensor
GOLDEN = "golden"  # `expected` of a drift finding: the tensor was held to its golden


@dataclass(frozen=True)
class Finding:
    kind: str  # one of KINDS
    tensor: str  # a tensor ("side/tensor" in the gate), an input, a side; "" for the whole case
    passed: bool  # False: this finding fails the case (or the gate); True: reported only
    data: dict[str, Any] = field(default_factory=dict)  # the facts, JSON-ready
    expected: str | None = None  # what the tensor was held to: an expectation's describe(), or GOLDEN

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")

    def to_json(self) -> dict:
        return asdict(self)


def judged(findings: list[Finding], passed: bool, expected: str) -> list[Finding]:
    """The findings as an expectation (or the golden) judges them."""
    return [replace(finding, passed=passed, expected=expected) for finding in findings]
