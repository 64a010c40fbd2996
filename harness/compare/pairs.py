"""One Pair type per kind of comparison (as torch.testing's BooleanPair, NumberPair, TensorLikePair):

- FloatPair: float values, element by element: ULP distance, +-0, NaN payloads, NaN/Inf classes;
- ExactPair: integer or bool values: equal or not, no distance;
- OneSidedPair: a tensor only one side produced;
- DigestPair: a side recorded only the tensor's digests (a capture in digest mode): equal or not by
  dtype, shape and MD5 (fast64 where a side has no MD5: a capture with hash="fast"), no distance;
- MismatchedPair: dtypes or shapes differ (values compared flattened where dtype and size agree).

`originate` is the one place where two arrays become a Pair. `Pair.compare()` lists the differences
as failing Findings (a bitwise judgement); an expectation (expectations.py) may judge them otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

import numpy as np

from harness.compare.arbiter import ExactComparison
from harness.compare.findings import DigestDiffers, DtypeDiffers, ExactValues, Finding, FloatValues, Missing, ShapeDiffers, Side
from harness.compare.heatmap import MismatchMap
from harness.compare.metrics import ElementStats, element_stats_and_map
from harness.dtypes import FLOAT_DTYPES
from harness.store.digest import Digest, StreamCheck
from harness.store.fast_hash import fast64


@dataclass
class Pair(ABC):
    name: str
    a: Digest | None  # None: side A did not produce it
    b: Digest | None
    axes: list[str] | None = field(default=None, kw_only=True)  # names of the last two axes, where the op knows them
    note: str | None = field(default=None, kw_only=True)  # e.g. the layout it is compared in
    exact: ExactComparison | None = field(default=None, kw_only=True)  # against the float64 reference, when one ran

    @property
    def bitwise(self) -> bool:
        return self.a is not None and self.a == self.b

    @property
    def digest(self) -> Digest:
        """Side A's digest, or B's where A has none (every pair has one)."""
        digest = self.a or self.b
        assert digest is not None
        return digest

    @property
    def values(self) -> FloatPair | ExactPair | None:
        """The element-by-element comparison, where there is one."""
        return None

    @abstractmethod
    def compare(self) -> list[Finding]:
        """The differences, each a failing Finding; [] for a bitwise-equal pair."""


@dataclass
class _ValuesPair(Pair):
    a: Digest
    b: Digest
    stats: ElementStats
    mismatches: MismatchMap | None = None  # where they differ, when they do

    @property
    def bitwise(self) -> bool:
        # digests come from the dumps' records; the element scan must agree with them
        return super().bitwise and self.stats.differing == 0

    def _unexplained(self) -> list[Finding]:
        """Digests that differ while every element is equal: the values are not the bytes recorded."""
        if self.a.md5 == self.b.md5:  # a flattened pair's shapes differ: its bytes are what count
            return []
        return [Finding(self.name, False, DigestDiffers(a=self.a.md5, b=self.b.md5, values=True))]


@dataclass
class FloatPair(_ValuesPair):
    @property
    def values(self) -> FloatPair:
        return self

    @property
    def measured(self) -> bool:
        """Whether max ULP/abs/rel mean something: not when every difference is a NaN/Inf class
        mismatch (those have no distance; they are counted apart)."""
        s = self.stats
        classes = s.nan_mismatch + s.inf_mismatch
        return classes == 0 or s.differing - classes - s.signed_zero_only - s.nan_payload_only > 0

    def compare(self) -> list[Finding]:
        s = self.stats
        if s.differing == 0:
            return self._unexplained()
        measured = self.measured
        return [Finding(self.name, False, FloatValues(
            elements=s.elements, differing=s.differing, measured=measured,
            max_ulp=s.max_ulp if measured else None,
            max_ulp_flat_index=s.max_ulp_flat_index if measured else None,
            max_abs=s.max_abs if measured else None,
            nan_mismatch=s.nan_mismatch, inf_mismatch=s.inf_mismatch,
            signed_zero_only=s.signed_zero_only, signed_zero_first_index=s.signed_zero_first_index,
            nan_payload_only=s.nan_payload_only, nan_payload_first_index=s.nan_payload_first_index,
        ))]


@dataclass
class ExactPair(_ValuesPair):
    @property
    def values(self) -> ExactPair:
        return self

    def compare(self) -> list[Finding]:
        s = self.stats
        if s.differing == 0:
            return self._unexplained()
        return [Finding(self.name, False, ExactValues(elements=s.elements, differing=s.differing, dtype=self.a.dtype))]


@dataclass
class OneSidedPair(Pair):
    @property
    def missing_side(self) -> Side:
        return "A" if self.a is None else "B"

    def compare(self) -> list[Finding]:
        return [Finding(self.name, False, Missing(side=self.missing_side))]


@dataclass
class DigestPair(Pair):
    """At least one side kept only the digests (and stats): the verdict is the digests' (dtype, shape,
    MD5, or fast64 where a side recorded no MD5); a stored side counts by its recorded digest (its fast64
    computed from its values where the other side has only that). Two sides that share no hash cannot be
    compared: a failing "digest" finding that says so. No values, so no distance: a tolerance cannot be
    checked on a differing DigestPair (expectations.Tolerance says it needs full tensors)."""

    a: Digest
    b: Digest
    digests_only: tuple[str, ...] = ("A", "B")  # the sides that kept no values
    stats: tuple[dict | None, dict | None] = (None, None)  # each side's recorded TensorStats fields, if any

    def compare(self) -> list[Finding]:
        findings = _layout_findings(self.name, self.a, self.b, flattened=False)
        if findings:
            return findings
        kind = self.a.shared_hash(self.b)
        if kind is None:
            return [Finding(self.name, False, DigestDiffers(
                a=self.a.label, b=self.b.label, values=False, digests_only=list(self.digests_only),
                comparable=False, hashes=[_hash_kind(self.a), _hash_kind(self.b)]))]
        if getattr(self.a, kind) != getattr(self.b, kind):
            data = DigestDiffers(a=getattr(self.a, kind), b=getattr(self.b, kind), values=False,
                                 digests_only=list(self.digests_only), stats={"a": self.stats[0], "b": self.stats[1]})
            findings.append(Finding(self.name, False, data if kind == "md5" else data.model_copy(update={"hash": kind})))
        return findings


def _layout_findings(name: str, a: Digest, b: Digest, flattened: bool) -> list[Finding]:
    """Failing findings for a dtype and a shape that differ (`flattened`: the values are compared anyway)."""
    findings = []
    if a.dtype != b.dtype:
        findings.append(Finding(name, False, DtypeDiffers(a=a.dtype, b=b.dtype)))
    if a.shape != b.shape:
        findings.append(Finding(name, False, ShapeDiffers(a=list(a.shape), b=list(b.shape), flattened=flattened)))
    return findings


def _hash_kind(digest: Digest) -> str:
    return "md5" if digest.fast64 is None else "fast64" if digest.md5 is None else "md5+fast64"


def _with_fast64(digest: Digest, array: np.ndarray | None, other: Digest) -> Digest:
    """A stored side's digest, with the fast64 of its values where the other side recorded only fast64."""
    if array is None or digest.fast64 is not None or other.md5 is not None or other.fast64 is None:
        return digest
    return replace(digest, fast64=fast64(array))


@dataclass
class MismatchedPair(Pair):
    a: Digest
    b: Digest
    flattened: FloatPair | ExactPair | None = None  # the values compared flattened: same dtype and size

    @property
    def values(self) -> FloatPair | ExactPair | None:
        return self.flattened

    def compare(self) -> list[Finding]:
        findings = _layout_findings(self.name, self.a, self.b, flattened=self.flattened is not None)
        return findings + (self.flattened.compare() if self.flattened else [])


def _values_pair(name: str, a: np.ndarray, b: np.ndarray, digests: tuple[Digest, Digest],
                 checks: tuple[StreamCheck | None, ...]) -> FloatPair | ExactPair:
    # one pass: stats, where they differ, and the digest checks of both sides' bytes
    stats, mismatches = element_stats_and_map(a, b, a.shape, checks=checks)
    kind = FloatPair if digests[0].dtype in FLOAT_DTYPES else ExactPair
    return kind(name, digests[0], digests[1], stats, mismatches)


def originate(name: str, a: np.ndarray | None, b: np.ndarray | None,
              digests: tuple[Digest | None, Digest | None] | None = None,
              checks: tuple[StreamCheck | None, StreamCheck | None] = (None, None),
              stats: tuple[dict | None, dict | None] = (None, None)) -> Pair:
    """The Pair for two arrays. `digests`: the arrays' digests where already known (a dump records
    them when written), to spare hashing the tensors again. `checks`: checks of the arrays' bytes
    against those digests (harness.store.digest.StreamCheck), fed by the element scan where there is one
    (the caller reads their verdicts; a check the scan did not feed hashes its bytes when asked).
    A side with a digest but no array kept only digests (a capture in digest mode): a DigestPair, whose
    `stats` are the sides' recorded TensorStats."""
    da, db = digests or (None if a is None else Digest.of(a), None if b is None else Digest.of(b))
    if da is None or db is None:
        return OneSidedPair(name, da, db)
    if a is None or b is None:
        only = tuple(side for side, array in (("A", a), ("B", b)) if array is None)
        return DigestPair(name, _with_fast64(da, a, db), _with_fast64(db, b, da), only, stats)
    da, db = da or Digest.of(a), db or Digest.of(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        flattened = _values_pair(name, a, b, (da, db), checks) if a.dtype == b.dtype and a.size == b.size else None
        return MismatchedPair(name, da, db, flattened)
    return _values_pair(name, a, b, (da, db), checks)
