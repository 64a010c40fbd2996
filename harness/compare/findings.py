"""The one result type: what a comparison, an expectation or the gate found, as data.

A Finding says whose it is, whether it fails and what it was held to; what was found is its `data`, a payload of
one class per kind, tagged with the kind (`Finding.kind`, the "kind" of the JSON report). Terminal, JSON, HTML
and the gate all carry Findings; only harness.reports.text turns one into words.

A payload's JSON is the fields its producer gave (`exclude_unset`): a field left at its default, such as a
"missing" finding's `reason` or a "digest" finding's `hash`, is not written (harness/reports/report.schema.json
has them optional).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

Side = Literal["A", "B"]  # a side of a comparison (in the gate, A: the golden, B: this run)
HashKind = Literal["md5", "fast64"]
ExactMetric = Literal["max_ulp", "normwise_u"]  # the harness.compare.exact.ExactError field a bound holds
PAYLOADS: dict[str, type[Payload]] = {}  # kind -> payload class, in definition order


class Payload(BaseModel):
    """What one kind of finding found; subclasses name their `kind` and register under it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[str]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        PAYLOADS[cls.kind] = cls

    def to_json(self) -> dict:
        return self.model_dump(exclude_unset=True)


# -- from a pair of tensors (harness.compare.pairs) -------------------------------------------------------


class Missing(Payload):
    """The tensor (or a capture tree's step or rank) is on one side only."""

    kind: ClassVar[str] = "missing"
    side: Side  # the side that lacks it
    reason: str | None = None  # why a capture map could not make it on side B


class DtypeDiffers(Payload):
    kind: ClassVar[str] = "dtype"
    a: str
    b: str


class ShapeDiffers(Payload):
    kind: ClassVar[str] = "shape"
    a: list[int]
    b: list[int]
    flattened: bool  # the values were compared flattened (same dtype and size)


class FloatValues(Payload):
    """Float elements differ; the distances are None where every difference is a NaN/Inf class mismatch."""

    kind: ClassVar[str] = "float-values"
    elements: int
    differing: int
    measured: bool  # whether max_ulp and max_abs mean something
    max_ulp: int | None
    max_ulp_flat_index: int | None
    max_abs: float | None
    nan_mismatch: int
    inf_mismatch: int
    signed_zero_only: int
    signed_zero_first_index: int | None
    nan_payload_only: int
    nan_payload_first_index: int | None


class ExactValues(Payload):
    """Integer or bool elements differ (no distance)."""

    kind: ClassVar[str] = "exact-values"
    elements: int
    differing: int
    dtype: str


class DigestDiffers(Payload):
    """The digests differ: where no side kept values (a capture in digest mode, a golden of digests), or where
    every element is equal but the bytes are not the ones recorded (`values`); two sides that share no hash
    cannot be compared (`comparable` false, `hashes` says what each recorded)."""

    kind: ClassVar[str] = "digest"
    a: str | None  # side A's hash (its label where not comparable)
    b: str | None
    values: bool  # both sides kept values, and they are equal
    digests_only: list[str] = []  # the sides that kept no values
    comparable: bool = True
    hashes: list[str] | None = None  # what each side recorded: "md5", "fast64" or "md5+fast64"
    stats: dict[str, dict[str, int | float | None] | None] | None = None  # "a", "b": each side's recorded stats
    hash: HashKind = "md5"  # the hash compared


# -- from an expectation (harness.compare.expectations) ----------------------------------------------------


class NotApplicable(Payload):
    """A tolerance on values that have no distance (e.g. max_ulp on bool values)."""

    kind: ClassVar[str] = "not-applicable"
    expectation: str
    dtype: str


class NeedsValues(Payload):
    """A tolerance on digests that differ while a side kept no values."""

    kind: ClassVar[str] = "needs-values"
    expectation: str
    sides: list[str]  # the sides that kept digests only


class ExactErrorOverBound(Payload):
    """A side farther from the float64 reference than its bound."""

    kind: ClassVar[str] = "exact-error"
    side: str
    metric: ExactMetric
    measured: float
    bound: float
    class_mismatch: int  # elements NaN/Inf where the reference is not, or the reverse


class WorseThan(Payload):
    """A side farther from the float64 reference than the other side allows."""

    kind: ClassVar[str] = "no-worse-than"
    side: str
    than: str
    factor: float
    normwise_u: float
    than_normwise_u: float
    class_mismatch: int
    than_class_mismatch: int


class NoReference(Payload):
    """A bound against the float64 reference where nothing could be measured."""

    kind: ClassVar[str] = "no-reference"
    expectation: str
    side: str | None  # None: for both sides
    reason: str  # a code of harness.compare.arbiter, or a reason given as text


PAIR_KINDS = tuple(PAYLOADS)  # what pairs and expectations find about one tensor
STRUCTURAL = (Missing, DtypeDiffers, ShapeDiffers)  # where, not the values, differ: reported even where they pass


# -- from the gate (harness.gate) --------------------------------------------------------------------------


class InputChanged(Payload):
    """An input's digest is not the golden's: each a digest's JSON (harness.store.digest.Digest.to_json), None
    where that one has no such input."""

    kind: ClassVar[str] = "input"
    golden: dict[str, Any] | None
    now: dict[str, Any] | None


class OtherGenerator(Payload):
    """The golden's inputs were made by another version of the input generator."""

    kind: ClassVar[str] = "generator"
    golden: int | None
    now: int | None


class Nondeterministic(Payload):
    kind: ClassVar[str] = "nondeterministic"
    side: str
    distinct: int  # different digests
    repeats: int


class ReplicasDiffer(Payload):
    """A tensor every rank must hold whole and alike (an all-reduced output, a replicated bias's gradient) whose
    bits differ between the ranks of one side: a failing finding whatever the tensor's expectation."""

    kind: ClassVar[str] = "replicas-differ"
    side: str
    ranks: list[int]  # the ranks whose copy differs from rank 0's
    world: int


class NoGolden(Payload):
    """No golden to check against: none yet (`written`: where one was written now), or one that cannot be read."""

    kind: ClassVar[str] = "no-golden"
    unreadable: str | None = None  # why it cannot be read
    written: str | None = None  # the golden written now


class EnvironmentChanged(Payload):
    """A fingerprint field changed since the golden (reported, never failing: it explains drift)."""

    kind: ClassVar[str] = "environment"
    field: str
    golden: Any  # the field's value (a str, int, float or bool, as recorded); None: not recorded
    now: Any


KINDS = tuple(PAYLOADS)
GOLDEN = "golden"  # `expected` of a drift finding: the tensor was held to its golden


@dataclass(frozen=True)
class Finding:
    tensor: str  # a tensor ("side/tensor" in the gate), an input, a side; "" for the whole case
    passed: bool  # False: this finding fails the case (or the gate); True: reported only
    data: Payload  # what was found
    expected: str | None = None  # what the tensor was held to: an expectation's describe(), or GOLDEN

    @property
    def kind(self) -> str:
        return self.data.kind

    def to_json(self) -> dict:
        return {"kind": self.kind, "tensor": self.tensor, "passed": self.passed, "data": self.data.to_json(),
                "expected": self.expected}


def judged(findings: list[Finding], passed: bool, expected: str) -> list[Finding]:
    """The findings as an expectation (or the golden) judges them."""
    return [replace(finding, passed=passed, expected=expected) for finding in findings]
