"""Comparison of two dumps: one TensorPair per tensor name, each judged against the case's expectation.

The comparison is data only; reporters turn it into text, JSON or HTML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.case import Expectation, ExpectSpec
from harness.digest import Digest
from harness.dtypes import FLOAT_DTYPES
from harness.dump import Dump
from harness.errors import XfalignError
from harness.locate import MismatchMap
from harness.metrics import ElementStats, element_stats_and_map
from harness.reports.text import difference_text, failure_text  # noqa: F401  (their home; kept importable here)


class InputMismatch(XfalignError):
    """The two sides did not consume the same inputs: comparing their outputs would mean nothing."""


@dataclass
class TensorPair:
    name: str
    a: Digest | None  # None: the side did not produce it
    b: Digest | None
    expectation: Expectation
    stats: ElementStats | None = None  # None when values could not be paired element by element
    findings: list[str] = field(default_factory=list)  # structural problems: missing, shape, dtype
    mismatches: MismatchMap | None = None  # where they differ, when they do
    axes: list[str] | None = None  # names of the last two axes, where the op knows them
    note: str | None = None  # e.g. the layout it is compared in

    @property
    def bitwise(self) -> bool:
        # digests come from the dumps' records; the element scan must agree with them
        return self.a is not None and self.a == self.b and (self.stats is None or self.stats.differing == 0)

    @property
    def comparable(self) -> bool:
        return self.stats is not None and self.a.dtype == self.b.dtype

    @property
    def exact(self) -> bool:
        """Integer or bool values: equal or not, no ULP distance."""
        return self.comparable and self.a.dtype not in FLOAT_DTYPES

    @property
    def measured(self) -> bool:
        """Whether max ULP/abs/rel mean something: a float pair whose differences are not all NaN/Inf
        class mismatches (those have no distance; they are counted apart)."""
        if self.stats is None or self.exact:
            return False
        s = self.stats
        classes = s.nan_mismatch + s.inf_mismatch
        return classes == 0 or s.differing - classes - s.signed_zero_only - s.nan_payload_only > 0

    @property
    def holds(self) -> bool:
        if self.expectation == "report":
            return True
        if self.expectation == "bitwise" or self.exact:  # max_ulp on integers and bools is equality
            return self.bitwise
        return (self.comparable and not self.findings and self.stats.nan_mismatch == 0
                and self.stats.inf_mismatch == 0 and self.stats.max_ulp <= self.expectation.max_ulp)


@dataclass
class SideInfo:
    name: str
    framework: str
    impl: str
    mode: str | None
    provenance: str
    environment: dict
    nondeterministic: dict[str, int]  # tensor -> distinct digests over repeats, where more than one

    @classmethod
    def of(cls, dump: Dump) -> SideInfo:
        m = dump.meta
        return cls(m["side"], m["framework"], m["impl"], m.get("mode"), m["provenance"], m["environment"],
                   dump.nondeterministic)


@dataclass
class CaseComparison:
    case_name: str
    a: SideInfo
    b: SideInfo
    pairs: list[TensorPair]
    inputs: dict[str, Digest]
    unavailable: str | None = None  # a side could not run here: nothing was compared

    @property
    def status(self) -> str:
        """The verdict every reporter shows: "pass", "fail" or "n/a" (a side could not run here)."""
        if self.unavailable:
            return "n/a"
        return "pass" if all(pair.holds for pair in self.pairs) else "fail"

    @property
    def passed(self) -> bool:
        """Nothing fails: true for "pass" and for "n/a" (N/A does not fail a run). Reports use `status`."""
        return self.status != "fail"

    @property
    def failing(self) -> list[TensorPair]:
        return [pair for pair in self.pairs if not pair.holds]

    @property
    def first_divergent(self) -> TensorPair | None:
        """First tensor, in forward -> backward order, that is not bitwise equal."""
        return next((pair for pair in self.pairs if not pair.bitwise), None)


def pair_tensors(name: str, a: np.ndarray | None, b: np.ndarray | None, expectation: Expectation,
                 digests: tuple[Digest | None, Digest | None] | None = None) -> TensorPair:
    """The one place where two arrays become a TensorPair. `digests`: the arrays' digests where they are
    already known (a dump records them when written), to spare hashing the tensors again."""
    if digests is None:
        digests = tuple(None if array is None else Digest.of(array) for array in (a, b))
    pair = TensorPair(name, *digests, expectation)
    if a is None or b is None:
        pair.findings.append(f"missing on side {'A' if a is None else 'B'}")
        return pair
    if a.dtype != b.dtype:
        pair.findings.append(f"dtype differs: {pair.a.dtype} vs {pair.b.dtype}")
    if a.shape != b.shape:
        pair.findings.append(f"shape differs: {list(a.shape)} vs {list(b.shape)}"
                             + ("; values compared flattened" if a.size == b.size else ""))
    if a.dtype == b.dtype and a.size == b.size:
        pair.stats, pair.mismatches = element_stats_and_map(a, b, a.shape)  # one pass: stats and where they differ
    return pair


def compare_dumps(a: Dump, b: Dump, expect: ExpectSpec | None = None) -> CaseComparison:
    missing = [f"side {d.side!r}: {d.meta['unavailable']}" for d in (a, b) if "unavailable" in d.meta]
    if missing:
        return CaseComparison(a.meta["case_name"], SideInfo.of(a), SideInfo.of(b), [], {}, "; ".join(missing))
    if a.meta["inputs"] != b.meta["inputs"]:
        differing = sorted(n for n in a.meta["inputs"].keys() | b.meta["inputs"].keys()
                           if a.meta["inputs"].get(n) != b.meta["inputs"].get(n))
        raise InputMismatch(f"sides {a.side!r} and {b.side!r} consumed different inputs ({', '.join(differing)}): "
                            "the dumps come from different cases or seeds")
    if expect is None:
        expect = ExpectSpec(**a.meta["case"].get("expect", {}))
    names = list(a.tensors) + [n for n in b.tensors if n not in a.tensors]
    a_digests, b_digests = a.digests, b.digests
    pairs = [pair_tensors(n, a.tensors.get(n), b.tensors.get(n), expect.for_tensor(n), (a_digests.get(n), b_digests.get(n)))
             for n in names]
    for pair in pairs:
        pair.axes = a.meta.get("axes", {}).get(pair.name)
        pair.note = a.meta.get("notes", {}).get(pair.name)
    return CaseComparison(a.meta["case_name"], SideInfo.of(a), SideInfo.of(b), pairs, a.input_digests)

