"""Comparison of two dumps of one case: one Pair per tensor name, judged by the case's expectation."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from harness.case import REFERENCE_SIDE, ExpectSpec
from harness.compare.arbiter import NOT_GIVEN, arbitrate
from harness.compare.expectations import Expectation, tag_names
from harness.compare.findings import Finding, ReplicasDiffer
from harness.compare.pairs import Pair, originate
from harness.errors import XfalignError, field_text, validation_problem
from harness.frameworks import adapter_for
from harness.store.digest import Digest, StreamCheck
from harness.store.dump import CheckedTensors, Dump, DumpError


class InputMismatch(XfalignError):
    """The two sides did not consume the same inputs: comparing their outputs would mean nothing."""


@dataclass
class SideInfo:
    name: str
    framework: str
    impl: str
    mode: str | None
    provenance: str
    environment: dict  # the side's fingerprint
    nondeterministic: dict[str, int]  # tensor -> distinct digests over repeats, where more than one

    @classmethod
    def of(cls, dump: Dump) -> SideInfo:
        m = dump.meta
        return cls(m["side"], m["framework"], m["impl"], m.get("mode"), m["provenance"], m["environment"],
                   dump.nondeterministic)

    @property
    def versions(self) -> str | None:
        """The versions of what ran, from the fingerprint's version fields (FrameworkAdapter.version_line);
        None for a framework not installed here (its fingerprint still lists them)."""
        try:
            adapter = adapter_for(self.framework)
        except KeyError:
            return None
        return adapter.version_line(self.environment)


@dataclass
class TensorResult:
    """A pair and what its expectation found."""

    pair: Pair
    expectation: Expectation
    findings: list[Finding]

    @classmethod
    def judge(cls, pair: Pair, expectation: Expectation) -> TensorResult:
        return cls(pair, expectation, expectation.check(pair))

    @property
    def name(self) -> str:
        return self.pair.name

    @property
    def holds(self) -> bool:
        return all(finding.passed for finding in self.findings)

    @property
    def failures(self) -> list[Finding]:
        return [finding for finding in self.findings if not finding.passed]


@dataclass
class CaseComparison:
    case_name: str
    a: SideInfo
    b: SideInfo
    tensors: list[TensorResult]
    inputs: dict[str, Digest]
    unavailable: dict[str, str] = field(default_factory=dict)  # side -> why it could not run here: nothing compared
    reference: SideInfo | None = None  # the float64 reference that arbitrates, if one ran
    reference_missing: str | None = None  # why none did

    @property
    def status(self) -> str:
        """The verdict every reporter shows: "pass", "fail" or "n/a" (a side could not run here)."""
        if self.unavailable:
            return "n/a"
        return "pass" if all(result.holds for result in self.tensors) else "fail"

    @property
    def passed(self) -> bool:
        """Nothing fails: true for "pass" and for "n/a" (N/A does not fail a run). Reports use `status`."""
        return self.status != "fail"

    @property
    def findings(self) -> list[Finding]:
        return [finding for result in self.tensors for finding in result.findings]

    @property
    def failing(self) -> list[TensorResult]:
        return [result for result in self.tensors if not result.holds]

    @property
    def first_divergent(self) -> TensorResult | None:
        """First tensor, in forward -> backward order, that is not bitwise equal."""
        return next((result for result in self.tensors if not result.pair.bitwise), None)


NO_REFERENCE = NOT_GIVEN  # worded by harness.reports.text


def recorded_expect(dump: Dump) -> ExpectSpec:
    """The expectations the dump's case recorded (none: report every tensor); DumpError naming the dump's
    meta.json and the field when they do not validate."""
    case = dump.meta["case"]
    if "expect" not in case:
        return ExpectSpec()
    try:
        return ExpectSpec.model_validate(case["expect"])
    except ValidationError as error:
        location, message = validation_problem(error)
        location = tuple(part for part in location if part not in tag_names())  # pydantic's, not the file's
        raise DumpError.in_meta(dump.directory, field_text(("case", "expect", *location)), message) from None


def compare_dumps(a: Dump, b: Dump, expect: ExpectSpec | None = None, exact: Dump | None = None,
                  exact_missing: str = NO_REFERENCE) -> CaseComparison:
    """`expect`: the case's expectations; by default those the dumps recorded. `exact`: the float64
    reference's dump (from the same inputs), the arbiter of every float tensor; without one, `exact_missing`
    says why (shown as N/A). A dump whose recorded expectations do not validate is refused (DumpError)."""
    # read dumps first: a dump made in memory (a golden's view of a step) may carry a read one's case
    for dump in sorted((d for d in (a, b, exact) if d is not None), key=lambda d: d.directory is None):
        recorded_expect(dump)
    unavailable = {d.side: d.meta["unavailable"] for d in (a, b) if "unavailable" in d.meta}
    if unavailable:
        return CaseComparison(a.meta["case_name"], SideInfo.of(a), SideInfo.of(b), [], {}, unavailable)
    if exact is not None:
        _check_reference(a, exact)
    if a.generator != b.generator:
        raise InputMismatch(f"sides {a.side!r} and {b.side!r} made their inputs with input generators {a.generator} and "
                            f"{b.generator}: run both sides with one xfalign version")
    if a.meta["inputs"] != b.meta["inputs"]:
        differing = sorted(n for n in a.meta["inputs"].keys() | b.meta["inputs"].keys()
                           if a.meta["inputs"].get(n) != b.meta["inputs"].get(n))
        raise InputMismatch(f"sides {a.side!r} and {b.side!r} consumed different inputs ({', '.join(differing)}): "
                            "the dumps come from different cases or seeds")
    if expect is None:
        expect = recorded_expect(a)
    a_names = a.names
    known = set(a_names)
    names = a_names + [n for n in b.names if n not in known]
    a_digests, b_digests = a.digests, b.digests
    axes, notes = a.meta.get("axes", {}), a.meta.get("notes", {})
    checks: tuple[dict[str, StreamCheck], dict[str, StreamCheck]] = ({}, {})
    pairs, values = [], []
    for name in names:
        (xa, ca), (xb, cb) = (_unchecked(dump.tensors, name, found) for dump, found in zip((a, b), checks))
        values.append((xa, xb))
        stats = (a.unstored.get(name, {}).get("stats"), b.unstored.get(name, {}).get("stats"))
        pair = originate(name, xa, xb, (a_digests.get(name), b_digests.get(name)), (ca, cb), stats)
        pair.axes, pair.note = axes.get(name), notes.get(name)
        pairs.append(pair)
    _settle((a, b), checks)  # nothing found is used before the bytes are known to be the recorded ones
    sides = (a.side, b.side)
    for pair, (xa, xb) in zip(pairs, values):
        reference = exact.tensors[pair.name] if exact is not None and pair.name in exact.tensors else None
        pair.exact = arbitrate(xa, xb, reference, sides, None if exact is not None else exact_missing, pair.name,
                               identical=pair.bitwise)
    results = [TensorResult.judge(pair, expect.for_tensor(pair.name)) for pair in pairs]
    for result in results:
        result.findings += _replicas_differ(result.pair.name, (a, b))
    return CaseComparison(a.meta["case_name"], SideInfo.of(a), SideInfo.of(b), results, a.input_digests,
                          reference=SideInfo.of(exact) if exact is not None else None,
                          reference_missing=None if exact is not None else exact_missing)


def _replicas_differ(name: str, dumps: tuple[Dump, Dump]) -> list[Finding]:
    """A failing finding for each side that ran on several ranks and whose ranks hold different bits of a
    tensor that must be replicated (harness.store.ranks)."""
    return [Finding(name, False, ReplicasDiffer(side=dump.side, ranks=dump.meta["replicas_differ"][name],
                                                world=dump.meta["world"]))
            for dump in dumps if name in dump.meta.get("replicas_differ", {})]


def _check_reference(a: Dump, exact: Dump) -> None:
    """The reference must be the float64 reference of this case, made from the same inputs."""
    if exact.side != REFERENCE_SIDE:
        raise InputMismatch(f"the dump given as the float64 reference is side {exact.side!r}'s, not a reference's "
                            f"(side {REFERENCE_SIDE!r})")
    if exact.meta["case_name"] != a.meta["case_name"] or exact.generator != a.generator \
            or exact.meta["inputs"] != a.meta["inputs"]:
        raise InputMismatch(f"the float64 reference of {exact.meta['case_name']!r} was not made from the inputs side "
                            f"{a.side!r} of {a.meta['case_name']!r} consumed")


def _unchecked(tensors, name: str, checks: dict[str, StreamCheck]) -> tuple[np.ndarray | None, StreamCheck | None]:
    """A tensor for the one pass, with the digest check its bytes still need (a read dump's: CheckedTensors)."""
    if name not in tensors:
        return None, None
    if not isinstance(tensors, CheckedTensors):
        return tensors[name], None
    array, check = tensors.unchecked(name)
    if check is not None:
        checks[name] = check
    return array, check


def _settle(dumps: tuple[Dump, Dump], checks: tuple[dict[str, StreamCheck], dict[str, StreamCheck]]) -> None:
    """The verdicts of the digest checks; those the element pass did not feed (a tensor one side lacks,
    shapes that cannot be compared, a pair of one chunk: harness.compare.metrics) hash their bytes here, in
    threads, the longest first (MD5 is one sequential stream per tensor). IntegrityError: side A's first
    corrupt tensor, else B's."""
    unfed = sorted((check for found in checks for check in found.values() if check.unfed_bytes),
                   key=lambda check: -check.unfed_bytes)
    if sum(check.unfed_bytes for check in unfed) >= 1 << 20 and len(unfed) > 1:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(StreamCheck.matches, unfed))
    for dump, found in zip(dumps, checks):
        if found:
            assert isinstance(dump.tensors, CheckedTensors)  # only a read dump's tensors make checks (_unchecked)
            dump.tensors.settle(found)
